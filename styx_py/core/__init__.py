"""The core every process shares: the programming model, the wire, config, partitioning, errors,
limits, the I/O ports and the serial reference model.

It imports nothing from the layers above it (``styx_py.io``, the worker, coordinator and client, the
CLI, local stack, audit, benchmarks and test kit); ``.importlinter`` contracts check this in CI.
"""
