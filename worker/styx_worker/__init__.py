"""The data plane: a worker's modules spell the transaction path.

ingress → batch (sequencer) → epoch (phase control) → executor (routing, ackshare) → conflicts →
commit → fallback (locks) → replies → egress (and the changelog), with snapshot and recovery beside;
the shell wires them.
"""
