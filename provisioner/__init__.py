"""rigbase control plane: the `provision` CLI, the HTTP API, the store and the reconcilers."""

__version__ = "0.1.0"
