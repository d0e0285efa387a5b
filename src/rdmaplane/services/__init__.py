"""The services: each wires the core and the adapters into one running thing. A service has
its pure decider in `policy/`, its transport shell (`grpc.py`, `http.py`) and one `root.py`
that builds what the configuration runs; services do not import each other."""
