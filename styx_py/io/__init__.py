"""Real implementations of the core's I/O ports that more than one process uses: the TCP transport
(``tcp``; its connections authenticated by ``handshake`` and bounded by ``links``) and admin requests
(``admin``), Kafka log reading and topic creation, the S3 blob store, batched produce, the metrics
endpoint and process start-up. The worker's own Kafka ingress and egress live in ``styx_worker``."""
