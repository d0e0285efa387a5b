"""The DRA driver for RDMA NICs (driver `rdma.rdmaplane.io`, docs/dra.md).

A mode of the node agent: the agent's discovery and health feed it, it publishes one
`ResourceSlice` pool per node and serves the kubelet's DRA plugin API. Pure parts:
`devices` (what the node offers, with attributes), `slices` (the ResourceSlice objects and
their taints), `claims` (an allocated claim → devices, CDI spec, environment). Adapters:
`cdi` and `checkpoint` (files), `kubeletplugin` (gRPC), `publisher` (the API server), and
`driver`, which ties them together for the agent.
"""
