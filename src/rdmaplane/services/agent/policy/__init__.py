"""The agent's decisions, pure: what its node's state means and what to publish."""
