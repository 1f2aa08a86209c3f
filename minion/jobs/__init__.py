"""Jobs on the node: each WorkerAssignment of desired["jobs"] (contracts/jobs.py) runs as a rootful podman
container; docs/minion-jobs.md.

- podman.py: the podman command line (global options from ContainerSettings) and what we ask it
- container.py: one assignment → the `podman run` arguments (limits, env, mounts, GPUs, port, labels)
- gpus.py: the node's GPUs from the CDI specs, and which worker holds which
- mounts.py: datastore and cache paths confined to their roots, bound into a per-worker directory
- logs.py: the k8s-file log of a container → ordered LogChunks, shipped with a resumable acked offset
- worker.py: one worker's life (start or adopt, wait, stop, collect, clean up) in its own thread
- agent.py: the desired-state handler that keeps the workers in line with desired["jobs"]
"""
