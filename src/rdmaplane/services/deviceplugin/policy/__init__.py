"""The device plugin's decisions, pure: which devices a container should get."""
