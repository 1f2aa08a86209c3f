"""Adapters: the control plane's doors to outside tools (Ansible for finalize). They know nothing of the
store or the services; the reconcilers hand them plain requests and record what comes back."""
