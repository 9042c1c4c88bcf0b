"""Hard limits. Every queue, frame and recursion in styx-py is bounded by one of these."""

MAX_PARTITIONS = 4096
MAX_FRAME_BYTES = 16 * 1024 * 1024  # one TCP frame (a batch of messages)
MAX_REQUEST_BYTES = 1024 * 1024  # one ingress request (arguments included)
MAX_CALL_DEPTH = 64  # nested calls inside one transaction
MAX_CALLS_PER_FUNCTION = 1024  # outgoing calls made by one function invocation
MAX_KEY_CHARS = 1024
