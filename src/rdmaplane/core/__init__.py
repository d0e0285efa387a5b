"""The pure core: what a node and a cluster are and what they mean, with no I/O. Takes data,
returns data; the time and chance are handed in. Held to mypy --strict and import contracts."""
