"""On-node finalize, the minion's side (docs/finalize.md): fetch the playbook bundle the heartbeat answer
names, run its playbook here through ansible-runner (a chroot into `--host-root` in the lab), report the
events and the outcome, and keep the last applied work to apply again at boot."""
