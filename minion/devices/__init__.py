"""Edge devices: the inference container of a device configuration (docs/devices.md)."""
