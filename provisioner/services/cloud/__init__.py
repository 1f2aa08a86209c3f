"""A cloud provider's side of the fleet: its regions' bootstrap, capacity, burst VMs for jobs, published
images. Reached through the provider driver (providers/base.py)."""
