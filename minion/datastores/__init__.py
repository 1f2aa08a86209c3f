"""Datastores on the node: job paths under a datastore root, and the mounts that serve them."""
