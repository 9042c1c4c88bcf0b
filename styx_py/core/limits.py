"""Bounds and tuning constants: every queue, frame, recursion and wait in styx-py that is not a setting
(settings, which an operator may change, are in :mod:`styx_py.core.config`).

Grouped by component, each section headed by the modules that apply it. Units are in the names
(``_S``, ``_MS``, ``_BYTES``; counts have none); a tuned value says the measurement that chose it.
"""

# ---- the cluster's shape and one transaction ------------------------------------------------------------
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

# ---- worker: replies and the sequencer log on Kafka (styx_worker.egress) -------------------------------
# One produce request: room for a few replies of the largest size.
MAX_EGRESS_PRODUCE_BYTES = 4 * MAX_REQUEST_BYTES
# A reply whose client was pushed it waits at most this long for a sequencer-log entry to ride with in
# one produce request (an idle cluster sends it alone then; 85 % of a worker's produce requests carried
# both at 500/s: benchmarks/results/paced-fetch.md).
REPLY_WAIT_FOR_LOG_ENTRY_S = 0.1
# A closing egress waits at most this long for what it held or queued to be acknowledged (a supervisor
# kills a worker 5 s after its SIGTERM).
EGRESS_STOP_FLUSH_S = 2.0

# ---- worker: replies pushed to their clients (styx_worker.feed) -----------------------------------------
# Clients one worker pushes to; more are refused with SubscribeRefused (they read the egress topic only).
MAX_REPLY_SUBSCRIBERS = 1024
# How often at most the clients that asked for them are sent the egress acknowledgements (EgressAcked);
# 50 ms instead saved no client CPU above the noise (benchmarks/results/resting-reader.md).
EGRESS_MARK_EVERY_S = 0.01

# ---- worker: partitions moved at a planned shape change (styx_worker.handoff) ---------------------------
# What one worker hands another, sent at once: well under what a connection may buffer (styx_py.io.tcp).
# Beyond it the change ends in a full recovery (S3).
MAX_HANDOFF_BYTES = 2 * MAX_FRAME_BYTES
# Entity bytes per Handoff piece: well under MAX_FRAME_BYTES with the rest of the piece.
HANDOFF_PIECE_BYTES = 4 * 1024 * 1024

# ---- worker: logs ---------------------------------------------------------------------------------------
MAX_LOGGED_VALUE_CHARS = 200  # of a reply's result or error, in a log line about it
