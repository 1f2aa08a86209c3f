#!/usr/bin/env bash
# `make demo`: the local lab walkthrough of docs/lab.md. A control plane, a region `lab` and two
# simulated nodes (network namespaces, each with its own swtpm, umockdev hardware and minion) come up;
# the nodes show up pending, are adopted by minion_id, attest and are finalized into maintenance; one is
# activated; a reservation assigned to it resolves from the operator's laptop namespace; a job runs on it
# in a podman container, reading a dataset uploaded from a local directory, and its logs are followed to `succeeded`, and a job asking for a GPU type the lab
# lacks waits with the reason; the lab is torn down and nothing is left. Every command is printed before
# it runs. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
PROVISION=$PWD/.venv/bin/provision
PY=$PWD/.venv/bin/python
export TSS2_LOG=all+none

# A home of its own (the lab refuses one that holds another control plane). It survives the demo
# with only the cached Debian root in it, so a second `make demo` skips debootstrap.
export RIGBASE_HOME=${RIGBASE_DEMO_HOME:-$PWD/.cache/demo-home}
unset RIGBASE_URL RIGBASE_TOKEN RIGBASE_DATABASE_URL
mkdir -p "$RIGBASE_HOME/cache" .cache/rootfs
# the Debian root is cached where `make test` keeps it for the finalize and lab tests: built once for all
[[ -e $RIGBASE_HOME/cache/rootfs ]] || ln -s "$PWD/.cache/rootfs" "$RIGBASE_HOME/cache/rootfs"

if [[ $(id -u) -ne 0 ]]; then
  echo "demo: the lab creates network namespaces; run it as root (sudo make demo)" >&2
  exit 1
fi

teardown() { "$PROVISION" lab down --yes >/dev/null 2>&1 || true; }
trap teardown EXIT

provision() { printf '\n\033[1m$ provision %s\033[0m\n' "$*"; "$PROVISION" "$@"; }

printf '\033[1m# RIGBASE_HOME=%s\033[0m\n' "$RIGBASE_HOME"
provision lab up --nodes 2
provision node list --region lab
provision node pending --region lab
provision node history node-1
provision node maintenance node-1 off

if "$PROVISION" reservation --help >/dev/null 2>&1; then
  provision reservation add jupyter --region lab --hostname jupyter --port 8888
  provision reservation assign jupyter --node node-1
  printf '\n\033[1m$ ip netns exec rigbase-lab-client python -m minion.reservations resolve jupyter --lan-address 10.77.0.3 --until 10.77.0.11\033[0m\n'
  printf '# the operator'"'"'s laptop (rigbase-lab-client) asks the LAN for jupyter.local over mDNS\n'
  ip netns exec rigbase-lab-client "$PY" -m minion.reservations resolve jupyter --lan-address 10.77.0.3 --until 10.77.0.11
  # the minion reports what it did in its next heartbeat (every 2 s in the lab)
  for _ in $(seq 20); do
    "$PROVISION" reservation show jupyter --json | grep -q '"state": "pending"' || break
    sleep 0.5
  done
  provision reservation show jupyter
else
  printf '\n# (reservations are not in this build: skipping the mDNS step)\n'
fi

# Jobs (docs/lab.md, step 5): a project, a job on node-1's (simulated) GPU in a podman container of the
# lab's own image, its logs followed to the end; then a job for a GPU type the lab does not have
provision project create lab-demo --description "the lab walkthrough"
# the job's dataset, uploaded from this checkout (docs/data.md); the node fetches it by digest
provision dataset create hello-numbers --source docs/examples/hello-data --project lab-demo
provision dataset show hello-numbers --project lab-demo
provision job create -f docs/examples/lab-hello.yaml --project lab-demo -y
provision job logs hello-lab --follow
job_state() { "$PROVISION" job show "$1" --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["state"])'; }
# the logs end with the container's output; the job's state follows with the node's next heartbeat
for _ in $(seq 60); do
  case $(job_state hello-lab) in succeeded | failed | stopped) break ;; esac
  sleep 0.5
done
provision job show hello-lab
provision job metrics hello-lab
provision job create -f docs/examples/lab-h100.yaml --project lab-demo -y
provision job show needs-h100
provision job list --project lab-demo

provision lab status
provision lab down --yes
trap - EXIT
printf '\n# left behind: %s lab namespaces; %s holds: %s\n' "$(ip netns list | grep -c '^rigbase-lab-' || true)" \
  "$RIGBASE_HOME" "$(ls -A "$RIGBASE_HOME" | tr '\n' ' ')"
printf '\ndemo done\n'
