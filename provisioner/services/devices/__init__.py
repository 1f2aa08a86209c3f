"""Devices: configurations, deployments, logs and their daily fees (docs/devices.md)."""
