"""A project\x27s datasets, models and checkpoints (docs/data.md)."""
