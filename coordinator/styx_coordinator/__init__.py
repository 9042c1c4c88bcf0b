"""The control plane: membership, placement, the epoch barrier and the admin API."""
