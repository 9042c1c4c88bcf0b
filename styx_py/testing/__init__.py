"""In-memory fakes of the network and the logs, and a whole cluster in one process (simulation)."""
