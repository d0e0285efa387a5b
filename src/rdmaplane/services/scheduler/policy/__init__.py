"""The extender's decisions, pure: where a pod fits, how well, and the wire it speaks."""
