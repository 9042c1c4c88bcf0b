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
# Rows one ``ctx.scan`` returns (its ``limit``, and the default): every partition of the operator answers
# up to this many, so one scan moves at most partitions x MAX_SCAN_LIMIT entries (styx_py.core.scan).
MAX_SCAN_LIMIT = 1000
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

# ---- client: the workers' ports (styx_client.sdk.push, .outbox) ----------------------------------------
# A connection to a worker that failed or dropped waits this long before the worker addresses are asked
# again; a reply that came through the log only asks again at once, but not more often than this.
WORKER_LINK_RETRY_S = 1.0
# How often the worker addresses are asked again while every connection is up (a worker that joined is
# found by then, or sooner by the first reply it sends through the log only).
WORKER_LIST_REFRESH_S = 10.0
# An empty frame this often on each connection, so the worker does not close it as idle (its idle
# timeout is at least 1 s; a keepalive of its own arrives every third of it).
WORKER_LINK_KEEPALIVE_S = 1.0
# The egress consumer's fetch wait while every worker pushes: the log then only confirms, and an idle
# consumer polling Tansu every 5 ms cost the client ~7 % and the broker ~2 % of a core at 500/s
# (benchmarks/results/pushed-replies.md). A reply that is not pushed waits for it: Tansu answers a
# waiting fetch after up to half of it.
PUSHED_EGRESS_FETCH_WAIT_MS = 25
# Bytes a worker's connection may hold unwritten before requests are no longer pushed on it (its worker
# fetches them anyway): a slow worker never makes the client buffer without bound.
MAX_PUSH_BUFFER_BYTES = 1 << 20
# Requests a second (acknowledged, counted over PUSH_RATE_WINDOW_S) below which they are pushed: at
# 2 000/s a push saved 3-4 ms of p50, at 3 000/s nothing, at 4 000/s it cost 2-3 ms
# (benchmarks/results/request-hops.md).
PUSH_BELOW_REQUESTS_PER_S = 2_500
# Requests a second below which a client that stopped pushing pushes again: one sending at about the
# threshold does not switch every window.
PUSH_AGAIN_BELOW_REQUESTS_PER_S = 2_000
PUSH_RATE_WINDOW_S = 0.25

# ---- client: the egress reader (styx_client.sdk.reader, .resting) --------------------------------------
# How long one poll of the reader may block: only how soon it notices cancellation or a new egress
# segment while no replies flow (replies are returned as soon as a fetch brings them).
EGRESS_POLL_MS = 250
# A request in flight this long makes the resting reader read the log: its reply may not have been
# pushed.
EGRESS_MISS_S = 0.5
# No egress mark (EgressAcked) from any worker this long, while a request is in flight, makes the
# resting reader read the log.
EGRESS_MARKS_STALE_S = 1.0
# How long the resting reader waits before it looks again.
EGRESS_REST_S = 0.02
# Checkpoints the resting reader keeps per egress partition; the oldest go first (each one dropped is a
# skip not made, never a record lost).
MAX_EGRESS_CHECKPOINTS = 10_000

# ---- client: Kafka, segments, requests in flight (styx_client.sdk.kafka, .config, .pending, .waiters) ---
# The least consumer fetch wait: Tansu never answers a 0 ms wait, and tiny ones only burn broker CPU.
MIN_FETCH_WAIT_MS = 5
# The longest one positioning fetch at the start may block, so the start-up deadline is checked.
POSITION_POLL_MS = 200
# Ingress segments asked about by name per metadata request, looking for a newer one.
SEGMENTS_ASKED_AHEAD = 4
# The default of how often the client looks for a newer ingress segment (ClientConfig.segment_poll_s):
# its writes count as read for sure for core.segments.FRESH_S after a look, and workers read the newest
# two segments (core.segments.LIVE).
SEGMENT_POLL_S = 0.5
# The default busy linger (ClientConfig's busy_linger_ms): how long a busy partition waits before its
# next batch; a quiet one never waits. 8 ms against 2 ms, YCSB-T 500-12 000/s: the same latency or lower
# up to 8 000/s, a quarter less CPU in all at 4 000/s (the broker's cut by half) and the client's 40 ->
# 30 µs per request at 8 000/s (benchmarks/results/resting-reader.md, "A longer busy linger").
BUSY_LINGER_MS = 8.0
MAX_BUSY_LINGER_MS = 1000.0
# Request ids whose record the pending table keeps after they left it, at least (and 2 x max_pending),
# to refuse a reused id carrying another request.
MIN_RECENT_REQUEST_IDS = 1024
# How often at most the deadline sweep runs while requests are due: how late a timeout may be reported.
DEADLINE_SWEEP_S = 0.01

# ---- gateway (styx_client.gateway) -------------------------------------------------------------------
# Consecutive failed status polls before the cluster counts as unreachable: one slow answer from a busy
# coordinator must not turn every request into a 503.
GATEWAY_UNREACHABLE_AFTER_POLLS = 3
# What one idempotency-table entry costs beside its body (its objects), counted against max_cache_bytes.
REPLY_CACHE_ENTRY_OVERHEAD_BYTES = 256
# The least max_body_bytes and max_cache_bytes a gateway accepts.
MIN_GATEWAY_BODY_BYTES = 1024
MIN_REPLY_CACHE_BYTES = 1024
# A bearer token's least length (RFC 6750 token68 characters).
MIN_TOKEN_CHARS = 8

# ---- internal TCP ports (styx_py.io.tcp) ----------------------------------------------------------------
MAX_HANDSHAKE_BYTES = 512  # the one frame a connection may send before it has authenticated
MAX_INBOUND_BYTES = 4 * MAX_FRAME_BYTES  # incomplete frames held by one process, across its connections
MAX_CONNECTIONS = 1024  # open connections to one coordinator or worker port
HANDSHAKE_TIMEOUT_S = 5.0  # to open a connection and authenticate it, either side

# ---- worker: the ingress topic's records (styx_worker.ingress, .sources, .pushed) ----------------------
# What one fetch may bring of one partition: room for a few requests of the largest size.
MAX_INGRESS_FETCH_PARTITION_BYTES = 4 * MAX_REQUEST_BYTES
# The longest one poll of the fetch loop waits for records before it looks at its segments again.
INGRESS_POLL_TIMEOUT_MS = 200
# A segment that left the live ones is read on at least this long, and at least this many fetch waits
# (``kafka_fetch_wait_ms``), then until it is taken to its high watermark: a fetch answered that long
# after the segment left was asked for after it left.
INGRESS_DRAIN_S = 1.0
INGRESS_DRAIN_FETCH_WAITS = 4
# Records clients pushed (styx_worker.pushed), per source read: kept while the records before them have
# not come (pushed by other clients, or fetched), beyond it the fetch brings them; and kept once taken
# until the fetch brings their copy to compare.
MAX_PUSHED_AHEAD = 1024
MAX_PUSHED_UNCONFIRMED = 4096

# ---- worker: how long the ingress fetch waits (styx_worker.pace) ----------------------------------------
# The ingress fetch wait while the records come pushed. A record that was not pushed after all waits up
# to half of it once, and up to INGRESS_PUSHED_POLL_S (measured at 100 ms without the poll pacing, at
# the SDK's push threshold: p99.9 125 ms).
INGRESS_PUSHED_FETCH_WAIT_MS = 50
# While the records come pushed, the fetch loop polls at most this often: 20 confirming rounds a second
# at most, on any broker (at 2 000/s each worker fetched 20 times a second instead of 118:
# benchmarks/results/paced-fetch.md).
INGRESS_PUSHED_POLL_S = 0.05
# Requests pushed this long, with none found not pushed, before the fetch waits longer (10 s before it
# left half of a 20 s run at 2 000/s on the short wait: benchmarks/results/paced-fetch.md).
PUSH_SETTLE_S = 2.0
# A record the fetch brought first whose push has not come this long after was not pushed.
PUSH_EXCUSE_S = 0.2
# How long a push, or a record found not pushed, counts: the fetch waits longer only while some record
# was pushed this recently, and after a record that was not pushed it waits as configured at least
# this long.
PUSH_WINDOW_S = 10.0
# Records fetched first and waiting for their push, at most (beyond it the oldest count as not pushed).
MAX_UNEXCUSED = 10_000
# A worker that took no request (fetched or pushed) this long fetches with ``kafka_idle_fetch_wait_ms``:
# so under load nothing changes (an idle two-worker cluster used 56 % of a core before, 9 % after:
# benchmarks/results/idle-cost.md).
INGRESS_IDLE_S = 1.0

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

# ---- coordinator: placement by load (styx_coordinator.load, .placement) ---------------------------------
# The time constant of each partition's measured load (an exponentially weighted rate from the
# workers' heartbeats): a burst seconds ago counts little, the last half minute most.
LOAD_WINDOW_S = 30.0
# A swap of two partitions must lower the heaviest worker's load by more than this share of the mean.
PLACEMENT_SWAP_GAIN = 0.10
MAX_PLACEMENT_SWAPS = 8  # swaps per shape change: each moves two partitions

# ---- coordinator: recovery (styx_coordinator.recovery) ----------------------------------------------
# The longest pause between two failed recovery attempts (they start at 0.1 s and double); how many are
# made at most is a setting (recovery_max_attempts, recovery_max_s).
MAX_RECOVERY_BACKOFF_S = 2.0
# A recovery attempt waits for the workers at least this many times the last successful restore took,
# and at most MAX_RECOVERY_TIMEOUT_FACTOR times epoch_timeout_ms (a durable-mode restore may read the
# log for tens of seconds; one cut off by a fixed timeout would be retried for ever).
RESTORE_TIMEOUT_FACTOR = 3.0
MAX_RECOVERY_TIMEOUT_FACTOR = 16

# ---- coordinator: shape changes and status (styx_coordinator.reshape, .status, .lookups) --------------
# A worker that left is waited for this long beyond failure_timeout_ms before the log is read without
# its Fenced: message delays and timer slack on a loaded machine.
RETIRE_LEASE_MARGIN_S = 1.0
MAX_RESHAPE_EVENTS = 20  # shape changes kept for ``styx status``
STATUS_RATE_WINDOW_S = 10  # ``styx status`` averages its rates over this many seconds
# A gateway's reply lookup: a worker that does not answer within this makes the answer incomplete; at
# most this many lookups are open at once.
LOOKUP_TIMEOUT_S = 2.0
MAX_OPEN_LOOKUPS = 64
# Request ids in one lookup, and reply bytes one worker puts in one answer (a found reply past that
# budget is listed as deferred: the gateway asks for it again in its next lookup). Well under
# MAX_FRAME_BYTES, so an answer always fits in one frame.
MAX_LOOKUP_IDS = 64
MAX_RECENT_LOOKUP = 500  # the most recent transactions one cluster-wide listing asks each worker for
MAX_LOOKUP_REPLY_BYTES = 4 * 1024 * 1024
# A consistent read of committed state (styx_worker.window, styx_coordinator.reads): entry bytes one
# worker puts in one answer (a partition whose rows pass it is cut short: the page ends at the last key
# every partition covered), and rows in one page of such a read (its ``limit``: the SDK's and ``styx
# state list``'s ``page_size``, default READ_PAGE; the gateway's pages stay within MAX_SCAN_LIMIT).
# Each page is a round trip through every process of the path (socket writes and wake-ups) on top of
# its rows: a scan of 10 000 entities costs less CPU in pages of 5 000 than of 1 000, but each page
# then holds the coordinator's and each worker's event loop for a millisecond or more at once, and
# transactions running beside the scan waited no less (benchmarks/results/scan-cpu.md,
# docs/benchmarks.md#consistent-scans): large pages suit a scan with nothing latency-sensitive beside it.
MAX_READ_BYTES = 4 * 1024 * 1024
MAX_READ_PAGE = 5000
READ_PAGE = MAX_SCAN_LIMIT

# ---- Kafka producers and consumers (styx_py.io.batching, .fetching, .kafka_logs) ------------------------
# Largest batch a lane builds (also the producer's max_batch_size; records larger than this still go,
# alone in their batch).
MAX_BATCH_BYTES = 512 * 1024
# A lane whose last batch carried at least this many records is busy: its next batch may linger
# (busy_linger_ms) so that more share it.
BUSY_RECORDS = 4
# aiokafka's request timeout is 40 s; a broker that needs more than this to list a partition is not
# usable anyway.
MAX_FETCH_WAIT_MS = 10_000
# A partition behind its high watermark this long without moving is starved (its consumer's fetch wait
# is raised); partitions are looked at this often at most.
STARVED_FETCH_PATIENCE_S = 0.25
STARVED_FETCH_CHECK_S = 0.05
# A log read (recovery, the audit's planning) starts with this fetch wait (it grows on a broker that
# needs more) and fails after this long without a new record.
LOG_READ_FETCH_WAIT_MS = 10
LOG_READ_STALL_TIMEOUT_S = 60.0
# A producer reading back a partition to settle a produce in doubt (styx_py.io.batching) tries for this
# long (the broker restarting) before the records fail as the produce did.
IN_DOUBT_REREAD_S = 60.0
IN_DOUBT_REREAD_BACKOFF_S = 0.1
# Offsets below the high watermark that no fetch serves a record of for this long hold nothing (a batch a
# broker killed mid-request counted and never stored: styx_py.io.kafka_logs.read_back).
IN_DOUBT_STALL_S = 5.0

# ---- the processes' own ports and runtime (styx_py.io.tcp, .links, .metrics, .runtime) ----------------
# A peer that stops reading is cut off once this much is buffered for it, instead of eating memory.
MAX_PEER_BUFFERED_BYTES = 4 * MAX_FRAME_BYTES
# Larger frames are read into one buffer of their size, piece by piece: readexactly() would grow the
# stream's buffer to the frame's size by reallocation. Measured on a coordinator fed 20 half-sent 16 MiB
# frames (a 64 MiB budget, so 4 read at a time): peak RSS growth 128 MiB with readexactly(), 71 MiB so.
SMALL_FRAME_BYTES = 64 * 1024
# The metrics and probe endpoint: a request head larger than this, or slower than this, is refused.
METRICS_MAX_HEAD_BYTES = 16 * 1024
METRICS_HEAD_TIMEOUT_S = 5.0
# Young collections of a server process: every SERVER_GC_GEN0 net allocations of container objects
# instead of Python's 700. A worker allocates several per transaction, almost all freed at once by
# reference counting; with the default it ran ~2 000 young and 16 full collections in a 15 s run at
# 11 000/s, ~1 s of CPU, the full ones ~30 ms each (every object of the process is scanned, the
# entity state among them), which is a pause on every transaction in flight. With this: 2-3 young
# collections, worker p99 126 / 111 ms against 217 / 190 ms (benchmarks/results/busy-linger-and-gc.md).
SERVER_GC_GEN0 = 20_000

# ---- log loss (styx_py.core.logmarks) ----------------------------------------------------------------------
MAX_LOSSES_SHOWN = 3  # losses named in the reason a cluster stops with; the others are counted

# ---- the local stack (styx_py.stack) ---------------------------------------------------------------------
SERVICE_START_TIMEOUT_S = 30.0  # S3, the broker or a cluster process not ready by then fails the start
# A restarted worker is not killed for being "failed" this long after its start: it has to register.
WORKER_RESTART_GRACE_S = 5.0

# ---- external calls and timers (styx_worker.outbox) ------------------------------------------------------
EXTERNAL_CONCURRENCY = 256  # external calls one worker has under way at once
EXTERNAL_QUEUE = 10_000  # intents one worker holds to call; beyond it the rest wait in the state
EXTERNAL_ATTEMPTS = 5  # attempts of one external call before its failure is the outcome
EXTERNAL_BACKOFF_S = 0.05  # the wait before the second attempt; doubled each time, up to the cap
EXTERNAL_BACKOFF_MAX_S = 2.0
EXTERNAL_TIMEOUT_S = 10.0  # one attempt: no answer by then is a failed attempt
EFFECT_POLL_S = 0.2  # the effect runner looks at its store at least this often
TIMER_REFIRE_S = 1.0  # a timer still pending this long after its firing was sent is fired again
MAX_LISTED_OWNERS = 20  # entities with pending calls or timers a worker's heartbeat names (the console)
