"""Jobs and placement: submission, the heartbeat's assignments, logs, preemption of burst VMs."""
