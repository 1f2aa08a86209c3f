"""The node's NVIDIA GPUs as containers get them: the driver installation (driver.py) and the CDI spec
the minion writes for it (cdi.py)."""
