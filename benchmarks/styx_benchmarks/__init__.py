"""Workloads (apps + loaders + checks) and the load driver."""
