"""The rules, one sub-package per domain, layered (pyproject.toml's contract, docs/architecture.md):
devices above jobs above cloud | accounts above fleet above data above regions | billing above common.
`beat` sits on top: it lists what every domain adds to a heartbeat."""
