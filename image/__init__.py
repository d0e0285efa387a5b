"""Building rdmaplane's image without a registry: `python3 -m image --help` (docs/image.md)."""
