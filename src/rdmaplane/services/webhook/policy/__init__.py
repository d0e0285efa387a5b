"""The webhook's decisions, pure: what a GPU pod gets, the review wire format, its certificate."""
