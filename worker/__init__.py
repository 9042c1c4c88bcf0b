"""The data plane: a worker's modules spell the transaction path.

ingress → sequencer → epoch (phase control) → executor → conflicts → commit → locks (fallback) → egress
"""
