"""Local lab: simulated nodes in network namespaces, each with its own swtpm, on one machine."""
