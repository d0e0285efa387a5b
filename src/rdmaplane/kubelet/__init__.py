"""The kubelet gRPC APIs: upstream-compatible .proto files (proto/) and their generated stubs (api/)."""
