"""The node agent: discovery, the embedded device plugin or DRA driver, the publisher, port
health and faults, metrics."""
