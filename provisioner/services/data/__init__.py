"""Data that jobs mount: regional datastores (docs/datastores.md)."""
