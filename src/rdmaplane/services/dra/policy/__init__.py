"""The DRA driver's decisions, pure: the devices and slices it offers, what a claim adds."""
