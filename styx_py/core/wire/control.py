"""The control plane: messages between the coordinator and the workers.

Every message that belongs to a cluster generation carries it (``gen``, bumped by every recovery):
a message of a generation that is over is dropped on arrival.
"""

from __future__ import annotations

import msgspec

from styx_py.core.graph import GraphVersion, OperatorSpec
from styx_py.core.logmarks import LogMark
from styx_py.core.wire.codes import Msg
from styx_py.core.wire.storage import Manifest

# ---- worker -> coordinator -------------------------------------------------------------------------


class Register(Msg, tag="reg"):
    node_id: str
    host: str
    port: int


class Heartbeat(Msg, tag="hb"):
    """From a worker's event loop; the coordinator echoes it (the worker's lease). A worker's carries
    ``load``: transactions it sequenced per partition since its process started (placement by load)."""

    node_id: str
    epoch: int
    load: dict[int, int] = msgspec.field(default_factory=dict)
    # External calls pending, of them running, and timers pending in its partitions (styx_worker.outbox).
    effects: list[int] = msgspec.field(default_factory=list)
    # The entities with some pending (their system-operator keys; the first MAX_LISTED_OWNERS).
    pending_owners: list[str] = msgspec.field(default_factory=list)


class WorkAvailable(Msg, tag="work"):
    node_id: str


class ExecDone(Msg, tag="xd"):
    """Every root of the epoch on this worker is done (to the peers; the Vote tells the coordinator)."""

    epoch: int
    node_id: str
    aborted: list[int]  # tids whose root saw a logic abort / error
    gen: int


class Vote(Msg, tag="vote"):
    epoch: int
    node_id: str
    conflicts: list[int]
    serial: list[int]  # tids that invoked one entity twice on this worker (they run in Phase.SERIAL)
    gen: int
    # What the coordinator needs of the ExecDone, which only the peers get: the sequencer counter after
    # this worker's batch, and the transactions still waiting here (it may start the next epoch early).
    lc: int = 0
    pending: int = 0


class Revote(Msg, tag="revote"):
    """The conflicts again, with the writes of the epoch's serial transactions left out (sent when
    some Vote named serial ones: their optimistic writes may depend on the order their branches
    arrived in, so they must not decide anyone else's conflicts)."""

    epoch: int
    node_id: str
    conflicts: list[int]
    gen: int


class EpochDone(Msg, tag="ed"):
    epoch: int
    node_id: str
    pending: int  # requests waiting in this worker's ingress, and rescheduled transactions
    committed: int
    aborted: int  # by user logic: Abort or another exception (bad requests are not in it)
    rescheduled: int
    gen: int
    rejected: int = 0  # bad requests (unknown operator/function, bad key or arguments), answered "failed"
    refused: int = 0  # requests not admitted (over the admission bound), answered "refused"


class SnapshotDone(Msg, tag="snap"):
    epoch: int
    node_id: str
    ok: bool
    error: str
    objects: int
    bytes: int
    seqlog_offset: int  # sequencer-log entries of epochs after this snapshot lie at or above it
    gen: int
    # Offsets the snapshot says the broker held (ingress positions, egress acknowledged: core.logmarks):
    # the coordinator checks them at every recovery.
    marks: list[LogMark] = msgspec.field(default_factory=list)


class Fenced(Msg, tag="fenced"):
    """A worker saw the view of generation ``gen``: it decides no epoch of an older generation any
    more. Recovery reads the sequencer log only once every worker said so (workers decide from each
    other's votes, so an older generation could otherwise still decide an epoch after the read)."""

    node_id: str
    gen: int


class GraphPrepared(Msg, tag="prepared"):
    """A worker's answer to :class:`PrepareGraph`: the graph loaded (and what it declares, which the
    coordinator compares with its own load of it), or why not."""

    node_id: str
    version: int
    ok: bool
    error: str
    operators: list[OperatorSpec]


class RecoverDone(Msg, tag="recovered"):
    node_id: str
    ok: bool
    error: str
    gen: int


class ReplayDiverged(Msg, tag="diverged"):
    """A replayed epoch did not reproduce what it did before the crash (a nondeterministic function):
    the cluster cannot go on without breaking what its clients were told. Terminal.

    Either a reply differs from the one on the egress log (``partition`` -1), or the writes of
    transaction ``tid`` on ``partition`` differ from the digest its first run logged."""

    node_id: str
    epoch: int
    request_id: str  # "" when the transaction's root is on another worker
    function: str  # "operator.function", or "" when the request is not known here
    logged: str  # what the original run answered, wrote (or how it classified the request), shown
    replayed: str  # what the replay answered or wrote, shown
    gen: int
    # Where the writes differ (the last fields, with defaults: absent when a reply differs).
    partition: int = -1
    tid: int = -1

    def describe(self) -> str:
        if self.partition >= 0:
            by = ", ".join(x for x in (self.function, self.request_id and f"request {self.request_id}") if x)
            by = by or "an unknown function"
            what = f"the writes of tid {self.tid} ({by}) on partition {self.partition}"
        elif self.function:
            what = f"{self.function} (request {self.request_id})"
        else:
            what = f"request {self.request_id}"
        return (
            f"replay of epoch {self.epoch} diverged on {self.node_id}: {what} gave {self.logged} before "
            f"the failure and {self.replayed} on replay. A function is not deterministic (use ctx.random(), "
            "ctx.now(), ctx.uuid() instead of random, time, uuid); the cluster stops, since going on "
            "would contradict replies already given"
        )


class LogLost(Msg, tag="loglost"):
    """The broker lost part of the cluster's log, as this worker found (an offset it recorded lies past
    the broker's end: styx_py.core.logmarks): the cluster must stop, never serve on. Terminal."""

    node_id: str
    what: str  # which log lost what: "ingress styx-ingress partition 2: recorded offset 1830, ..."


# ---- coordinator -> worker -------------------------------------------------------------------------


class WorkerInfo(msgspec.Struct, array_like=True):
    node_id: str
    sid: int  # sequencer id, 1..n
    host: str
    port: int


class ClusterView(Msg, tag="view"):
    version: int  # bumped on every broadcast of the view
    workers: list[WorkerInfo]
    placement: list[str]  # partition index -> owning worker node_id
    graph_path: str | None
    operators: list[OperatorSpec]
    kafka_bootstrap: str | None
    ingress_topic: str
    egress_topic: str
    seqlog_topic: str
    gen: int
    # Sequencer-id space: tid = sid + lc * n_seq. Never shrinks when workers leave, so tids issued after
    # a scale-in stay above every earlier one (0 in views of older coordinators: len(workers)).
    n_seq: int = 0
    # Every committed version of the graph, in deploy order (``graph_path`` is the last one's). Last,
    # with a default: empty from a coordinator that predates code updates (the one version then).
    versions: list[GraphVersion] = msgspec.field(default_factory=list)
    # A planned shape change at a barrier: every worker finished the last epoch and none runs until
    # the new placement holds, so each hands the partitions it loses straight to their new owners
    # (:class:`~styx_py.core.wire.peer.Handoff`).
    handoff: bool = False


class EpochStart(Msg, tag="es"):
    epoch: int
    lc: int  # global max sequencer counter (Mencius rebalancing)
    replay: bool  # re-run the logged composition of this epoch (recovery)
    snapshot: bool  # take a snapshot at the end of this epoch
    gen: int
    version: int = 0  # the graph version that runs this epoch (0: the first, from an older coordinator)
    segment: int = 0  # the newest ingress segment: workers read core.segments.live(segment)


class PrepareGraph(Msg, tag="prepare"):
    """A code update, phase one: load and validate version ``version`` of the graph and keep it ready
    (it runs only from the epoch a later view's ``versions`` and ``EpochStart.version`` name)."""

    version: int
    import_path: str


class SnapshotResult(Msg, tag="snapres"):
    """The coordinator's verdict on the snapshot of ``epoch``: durable (manifest written) or not."""

    epoch: int
    ok: bool
    gen: int


class Recover(Msg, tag="recover"):
    manifest: Manifest
    replay_until: int  # last decided epoch: epochs manifest.epoch+1 .. replay_until are replayed
    gen: int
    # A planned shape change at a barrier (``replay_until`` is the last epoch that ran, and nothing is
    # replayed): a worker that finished it keeps the partitions it still owns as they are and takes the
    # ones it gains from their old owners' :class:`~styx_py.core.wire.peer.Handoff`.
    keep: bool = False
    segment: int = 0  # the newest ingress segment (core.segments): what a fresh process reads live


class Halt(Msg, tag="halt"):
    """The cluster is degraded (a replay diverged): run no more epochs, report not ready."""

    reason: str


class Retire(Msg, tag="retire"):
    """This worker is no longer part of the cluster (drained, or replaced after it was lost): its
    partitions run elsewhere from generation ``gen`` on. It stops and its process exits (0)."""

    reason: str
    gen: int
    # At a planned change: the new generation's view, to hand this worker's partitions to their new
    # owners before it stops (None: it was lost, someone else recovers them).
    view: ClusterView | None = None
