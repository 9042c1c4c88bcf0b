"""Hard limits. Every queue, frame and recursion in styx-py is bounded by one of these."""

MAX_PARTITIONS = 4096
MAX_FRAME_BYTES = 16 * 1024 * 1024  # one TCP frame (a batch of messages)
MAX_CALL_DEPTH = 64  # nested calls inside one transaction
MAX_CALLS_PER_FUNCTION = 1024  # outgoing calls made by one function invocation
# Messages one worker keeps for later (a peer ahead of it: styx_worker.inbox); beyond it they are dropped
# and the epoch they belong to is recovered, as for a message lost on the network.
MAX_HELD_MESSAGES = 100_000

# ---- one request, on every path (checked by styx_py.core.requests: SDK, gateway, worker) ----------------
MAX_REQUEST_BYTES = 1024 * 1024  # one ingress record: the msgpack-encoded request, arguments included
MAX_REQUEST_ID_CHARS = 128  # a request id: 1..128 characters
MAX_NAME_CHARS = 256  # the operator and the function a request names
MAX_KEY_CHARS = 1024  # a str entity key
MIN_INT_KEY, MAX_INT_KEY = -(2**63), 2**64 - 1  # an int entity key: what msgpack carries
MAX_ARG_DEPTH = 64  # arrays/maps nested inside one argument (``[1]`` is 1, ``[[1]]`` is 2)

# ---- internal TCP ports (styx_py.io.tcp) ----------------------------------------------------------------
MAX_HANDSHAKE_BYTES = 512  # the one frame a connection may send before it has authenticated
MAX_INBOUND_BYTES = 4 * MAX_FRAME_BYTES  # incomplete frames held by one process, across its connections
MAX_CONNECTIONS = 1024  # open connections to one coordinator or worker port
HANDSHAKE_TIMEOUT_S = 5.0  # to open a connection and authenticate it, either side
# What one worker hands another at a planned shape change (styx_worker.handoff), sent at once: well under
# what a connection may buffer (styx_py.io.tcp). Beyond it the change ends in a full recovery (S3).
MAX_HANDOFF_BYTES = 2 * MAX_FRAME_BYTES
