"""The kubelet gRPC APIs: upstream-compatible .proto files (proto/), generated stubs (api/)."""
