"""The topology-aware scheduler extender service."""
