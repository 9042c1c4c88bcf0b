"""The audit rules: plain functions over plain values, with no Spark inside (the job only distributes them).

Each rule takes one group of records (everything about one request id, one tid, one sequencer-log
entry, …) and returns :class:`Finding` values; a finding of severity ``error`` fails the audit.
Inputs are dicts as Arrow's ``to_pylist()`` gives them, so the same functions run in a Spark task
and in a unit test.

Where the rules come from (DESIGN.md §3, §4, ``styx_worker.epoch``, ``styx_worker.sequencer``):

* **Exactly once.** A request id submitted ``m`` times (clients may resend: the cluster answers a
  resent id with the earlier reply) has exactly ``m`` replies, all identical; none is missing, none
  belongs to an id no client sent, no tid answers two request ids.
* **Ordering.** Each epoch every worker logs one :class:`~styx_py.core.wire.SeqLogEntry` before any reply
  of that epoch leaves: its rescheduled transactions first (old tids, ascending), then its fresh ones,
  whose tids are ``sid + lc·n`` for ``lc`` in ``[lc_start, lc_end)`` (Mencius; n is the entry's
  ``n_seq``, the sequencer-id space, which the cluster keeps at the most workers it ever had, so after
  a scale down it exceeds the generation's workers; entries of older versions carry 0, and n is then
  the generation's workers); all workers start an epoch at the same counter, the previous epoch's
  maximum. A reply's
  epoch is the last epoch in which the log runs its tid, for the same request id. Only the generation
  that ran an epoch counts: a generation that died mid-epoch may have logged part of an epoch whose
  number the next generation reused.
* **State.** The workload's invariants hold on the snapshot (:meth:`Workload.check_state`), and the
  snapshot equals the serial replay of the committed log, in commit order ``(epoch, phase, tid)``,
  up to the snapshot's epoch; every reply equals its serial outcome.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key
from styx_py.core.serial import GraphAt, PendingByEpoch, Writes, apply_serially
from styx_py.core.wire import UNDECODABLE, Reply, ReplyStatus, Request, decode_value

ERROR = "error"
WARNING = "warning"
SKIPPED = "skipped"  # a check that could not be made; the finding's message says why. Never a pass.
INFO = "info"  # not a finding: what a check counted (taken out of the findings by the audit job)

CHECKS: dict[str, str] = {
    "exactly_once.lost_reply": "every ingress request has a reply",
    "exactly_once.duplicate_reply": "no request has more replies than submissions",
    "exactly_once.orphan_reply": "no reply without a request",
    "exactly_once.changed_result": "all replies to one request id are identical (across recoveries)",
    "exactly_once.tid_clash": "no tid answers two request ids",
    "ordering.mencius": "tids follow the Mencius interleaving of the sequencer log",
    "ordering.epoch": "each reply's epoch and tid agree with the sequencer log",
    "ordering.log": "the sequencer log is complete and its counters are rebalanced every epoch",
    "input.undecodable": "every log record decodes",
    "invariant": "the workload's invariants hold on the snapshot",
    "serial.state": "the snapshot equals the serial replay of the log up to its epoch",
    "serial.outcome": "every reply equals its outcome in the serial replay",
    "changelog.once": "every committed write is on the changelog once: none twice, none missing, none of an "
    "uncommitted transaction",
    "changelog.order": "each changelog partition follows the commit order (epoch, phase, tid)",
    "changelog.snapshot": "the changelog up to the snapshot's epoch rebuilds the snapshot's state",
    "effects.response": "each external-call intent a committed transaction recorded (in the serial replay's "
    "styx.outbox writes) has one committed styx.outbox.complete that took effect, or is pending at the end "
    "of the log (a warning)",
    "effects.continuation": "per idempotency key at most one completion took effect (its continuation ran "
    "once), the one that cleared the intent in the serial replay",
    "timers.fired": "each timer fired at most once, and not before its due time as recorded in styx.timers "
    "(the firing request's sequenced time, its ingress timestamp)",
}

MAX_LISTED = 5  # items spelled out in one message
# The checks made during the serial replay (skipped without it).
_REPLAYED = ("serial.state", "serial.outcome", "effects.response", "effects.continuation", "timers.fired")


@dataclass(frozen=True, slots=True)
class Finding:
    check: str  # a key of CHECKS, possibly with a suffix (``invariant.ycsbt``)
    subject: str  # what it is about: a request id, "tid 17", "epoch 4", an entity
    message: str
    severity: str = ERROR


def skipped_checks(
    workload: str | None, replay_app: str | None, serial: bool, no_snapshot: str | None
) -> list[Finding]:
    """The state checks this audit cannot make, each with the reason (severity :data:`SKIPPED`).

    ``replay_app``: the graph the serial replay would run (None: none known); ``serial``: whether the
    replay was asked for; ``no_snapshot``: why no snapshot was read (None: one was read).
    """
    out: list[Finding] = []
    if workload is None:
        out.append(Finding("invariant", "audit", "no --workload given: no invariants to check", SKIPPED))
    elif no_snapshot is not None:
        out.append(Finding(f"invariant.{workload}", "snapshot", f"{no_snapshot}: no state to check", SKIPPED))
    if not serial:
        why = "--no-serial: the log was not replayed"
        out += [Finding(c, "audit", why, SKIPPED) for c in _REPLAYED]
    elif replay_app is None:
        why = "no --workload or --app given: no graph to replay the log with"
        out += [Finding(c, "audit", why, SKIPPED) for c in _REPLAYED]
    elif no_snapshot is not None:
        why = f"{no_snapshot}: no state to compare the serial replay with"
        out.append(Finding("serial.state", "snapshot", why, SKIPPED))
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    check: str
    what: str  # what the check verifies
    errors: int
    warnings: int
    verdict: str  # FAIL | skipped | pass (warnings) | pass
    reason: str = ""  # why it was skipped


def checks_for(workload: str | None) -> dict[str, str]:
    """:data:`CHECKS` with ``invariant`` named after the workload whose invariants are checked."""
    if workload is None:
        return dict(CHECKS)
    return {(f"invariant.{workload}" if k == "invariant" else k): v for k, v in CHECKS.items()}


def verdicts(
    checks: Mapping[str, str], counts: Mapping[str, Mapping[str, int]], samples: Sequence[Finding]
) -> list[Verdict]:
    """One verdict per check: FAIL with any error, else ``skipped`` when it could not be made (never
    ``pass``), else pass. A check counted under a suffixed name (``invariant.ycsbt``) replaces its
    generic entry in ``checks`` (``invariant``)."""
    names = set(counts) | {c for c in checks if not any(n.startswith(c + ".") for n in counts)}
    reasons = {f.check: f.message for f in samples if f.severity == SKIPPED}
    out = []
    for name in sorted(names):
        by = counts.get(name, {})
        errors, warnings = by.get(ERROR, 0), by.get(WARNING, 0)
        if errors:
            verdict = "FAIL"
        elif by.get(SKIPPED):
            verdict = "skipped"
        else:
            verdict = "pass (warnings)" if warnings else "pass"
        what = checks.get(name) or checks.get(name.split(".")[0], "")
        out.append(
            Verdict(
                name, what, errors, warnings, verdict, reasons.get(name, "") if verdict == "skipped" else ""
            )
        )
    return out


def _listed(items: Sequence[object], limit: int = MAX_LISTED) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown if len(items) <= limit else f"{shown}, … ({len(items)} in all)"


def _at(rows: Sequence[Mapping[str, Any]]) -> str:
    return _listed([f"p{r['partition']}@{r['offset']}" for r in rows])


def _shown(raw: bytes | None, limit: int = 80) -> str:
    if raw is None:
        return "nil"
    try:
        text = repr(decode_value(raw))
    except UNDECODABLE:
        text = f"<{len(raw)} undecodable bytes>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_reply(r: Mapping[str, Any]) -> str:
    what = f"result {_shown(r['result'])}" if r["status"] == "committed" else f"error {r['error']!r}"
    return f"{r['status']} tid {r['tid']} epoch {r['epoch']} phase {r['phase']} {what}"


# ---- exactly once: one group per request id -------------------------------------------------------

_OUTCOME = ("tid", "epoch", "phase", "status", "result", "error", "error_type", "request_ts_ms")


def check_request(
    request_id: str, requests: Sequence[Mapping[str, Any]], replies: Sequence[Mapping[str, Any]]
) -> list[Finding]:
    """Everything the ingress and egress logs hold about one request id.

    ``requests``: its ingress records (partition, offset, operator, function, key); ``replies``: its
    egress records (partition, offset and the :class:`~styx_py.core.wire.Reply` fields).
    """
    out: list[Finding] = []
    if not requests:
        first = replies[0]
        out.append(
            Finding(
                "exactly_once.orphan_reply",
                request_id,
                f"reply to unknown request {request_id}: no ingress record has this id "
                f"(egress {_at(replies)}: {describe_reply(first)})",
            )
        )
        return out
    if not replies:
        r = requests[0]
        out.append(
            Finding(
                "exactly_once.lost_reply",
                request_id,
                f"request {request_id} ({r['operator']}.{r['function']} on {r['key']!r}, "
                f"ingress {_at(requests)}) has no reply on the egress log",
            )
        )
        return out
    distinct: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for rep in replies:
        distinct.setdefault(tuple(rep[f] for f in _OUTCOME), []).append(rep)
    if len(distinct) > 1:
        variants = "; ".join(f"egress {_at(rows)}: {describe_reply(rows[0])}" for rows in distinct.values())
        out.append(
            Finding(
                "exactly_once.changed_result",
                request_id,
                f"request {request_id} was answered in {len(distinct)} different ways: {variants}",
            )
        )
    if len(replies) > len(requests):
        same = "identical copies" if len(distinct) == 1 else "not all identical"
        out.append(
            Finding(
                "exactly_once.duplicate_reply",
                request_id,
                f"request {request_id} has {len(replies)} replies for {len(requests)} submission(s) "
                f"({same}; egress {_at(replies)}; ingress {_at(requests)})",
            )
        )
    return out


def check_undecodable(kind: str, count: int, example: str | None) -> list[Finding]:
    """Records of a log that do not decode as its kind. The cluster skips such ingress records (no
    request id survives, so there is no one to answer): a warning. It never writes such replies or
    sequencer-log entries: an error (a foreign producer, or corruption)."""
    if count == 0:
        return []
    ingress = kind == "ingress"
    why = (
        "the cluster skips them: no reply is possible" if ingress else "the cluster never writes such records"
    )
    return [
        Finding(
            "input.undecodable",
            kind,
            f"{count} {kind} records do not decode ({why}); the first: {example}",
            WARNING if ingress else ERROR,
        )
    ]


# ---- ordering: one group per tid --------------------------------------------------------------------


def check_tid(
    tid: int, logged: Sequence[Mapping[str, Any]], replies: Sequence[Mapping[str, Any]]
) -> list[Finding]:
    """The sequencer-log rows of ``tid`` (of the generations that ran their epochs: epoch, node_id,
    request_id, fresh) against the replies that carry it (request_id, epoch, partition, offset)."""
    out: list[Finding] = []
    subject = f"tid {tid}"
    answered = sorted({r["request_id"] for r in replies})
    if len(answered) > 1:
        out.append(
            Finding(
                "exactly_once.tid_clash",
                subject,
                f"tid {tid} answers {len(answered)} different requests: {_listed(answered)} "
                f"(egress {_at(replies)})",
            )
        )
    if not logged:
        for rid in answered:
            rows = [r for r in replies if r["request_id"] == rid]
            out.append(
                Finding(
                    "ordering.epoch",
                    subject,
                    f"reply to {rid} (egress {_at(rows)}) carries tid {tid} epoch {rows[0]['epoch']}, "
                    f"but the sequencer log never ran tid {tid}",
                )
            )
        return out
    owners = sorted({r["request_id"] for r in logged})
    if len(owners) > 1:
        out.append(
            Finding(
                "ordering.mencius",
                subject,
                f"the sequencer log gives tid {tid} to {len(owners)} requests: "
                + _listed([f"{r['request_id']} (epoch {r['epoch']}, {r['node_id']})" for r in logged]),
            )
        )
    fresh = sorted(r["epoch"] for r in logged if r["fresh"])
    if len(fresh) != 1:
        where = _listed(sorted({r["epoch"] for r in logged}))
        problem = "never assigned fresh" if not fresh else f"assigned fresh {len(fresh)} times"
        out.append(Finding("ordering.mencius", subject, f"tid {tid} is {problem} (logged in epochs {where})"))
    elif any(r["epoch"] < fresh[0] for r in logged):
        out.append(
            Finding(
                "ordering.mencius", subject, f"tid {tid} is rescheduled before epoch {fresh[0]} assigned it"
            )
        )
    last = max(r["epoch"] for r in logged)
    owner = next(r["request_id"] for r in logged if r["epoch"] == last)
    for rid in answered:
        rows = [r for r in replies if r["request_id"] == rid]
        epochs = sorted({r["epoch"] for r in rows})
        if rid != owner:
            out.append(
                Finding(
                    "ordering.epoch",
                    subject,
                    f"reply to {rid} (egress {_at(rows)}) carries tid {tid}, which the sequencer log "
                    f"gives to request {owner} (epoch {last})",
                )
            )
        elif epochs != [last]:
            out.append(
                Finding(
                    "ordering.epoch",
                    subject,
                    f"reply to {rid} (egress {_at(rows)}) says epoch {_listed(epochs)}, but the "
                    f"sequencer log last runs tid {tid} in epoch {last}",
                )
            )
    return out


# ---- ordering: one sequencer-log entry --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntrySummary:
    """What :func:`check_epochs` needs of one (effective) sequencer-log entry."""

    epoch: int
    gen: int
    node_id: str
    sid: int | None  # None when the entry assigned no fresh tid
    lc_start: int
    lc_end: int
    fresh: int
    rescheduled: int
    resent: int


def mencius_tids(sid: int, n_seq: int, lc_start: int, lc_end: int) -> list[int]:
    """The tids sequencer ``sid`` of ``n_seq`` assigns for counters ``[lc_start, lc_end)``
    (styx_worker.sequencer)."""
    return [sid + lc * n_seq for lc in range(lc_start, lc_end)]


def check_entry(entry: Mapping[str, Any], workers: int) -> tuple[list[Finding], EntrySummary]:
    """One worker's logged batch of one epoch. Its tids follow the sequencer-id space it logged
    (``n_seq``); ``workers``, the number of workers of its generation, stands in for an entry of a
    version that did not log it (0)."""
    n_seq = entry.get("n_seq") or workers
    epoch, node, gen = entry["epoch"], entry["node_id"], entry["gen"]
    lc_start, lc_end = entry["lc_start"], entry["lc_end"]
    subject = f"epoch {epoch} {node}"
    where = f"epoch {epoch}, worker {node} (generation {gen}, {n_seq} sequencers)"
    out: list[Finding] = []
    entries = entry["entries"]
    roots = [e["tid"] for e in entries if e["kind"] == "run"]
    resent = [e["request_id"] for e in entries if e["kind"] != "run"]
    if any(t is None or t <= 0 for t in roots):
        out.append(Finding("ordering.mencius", subject, f"{where}: invalid tids {_listed(roots)}"))
        return out, EntrySummary(epoch, gen, node, None, lc_start, lc_end, 0, len(roots), len(resent))
    kinds = [e["kind"] for e in entries]
    if kinds != sorted(kinds, key=lambda k: k != "run"):
        out.append(
            Finding("ordering.mencius", subject, f"{where}: a resent request is logged before a transaction")
        )
    n_fresh = lc_end - lc_start
    sid: int | None = None
    if n_fresh < 0 or n_fresh > len(roots):
        out.append(
            Finding(
                "ordering.mencius",
                subject,
                f"{where}: counters [{lc_start}, {lc_end}) do not match its {len(roots)} transactions",
            )
        )
        return out, EntrySummary(epoch, gen, node, None, lc_start, lc_end, 0, len(roots), len(resent))
    fresh = roots[len(roots) - n_fresh :]
    resched = roots[: len(roots) - n_fresh]
    if fresh:
        sid = fresh[0] - lc_start * n_seq
        expected = mencius_tids(sid, n_seq, lc_start, lc_end)
        if not 1 <= sid <= n_seq or fresh != expected:
            shown = (
                f"expected {_listed(expected)}" if 1 <= sid <= n_seq else f"sid {sid} is not in 1..{n_seq}"
            )
            out.append(
                Finding(
                    "ordering.mencius",
                    subject,
                    f"{where}: fresh tids {_listed(fresh)} do not follow tid = sid + lc·{n_seq} for lc in "
                    f"[{lc_start}, {lc_end}): {shown}",
                )
            )
            sid = None
    if resched != sorted(resched) or (fresh and resched and resched[-1] >= fresh[0]):
        out.append(
            Finding(
                "ordering.mencius",
                subject,
                f"{where}: rescheduled tids {_listed(resched)} are not ascending and below the fresh ones",
            )
        )
    return out, EntrySummary(epoch, gen, node, sid, lc_start, lc_end, len(fresh), len(resched), len(resent))


def check_epochs(summaries: Sequence[EntrySummary], n_by_gen: Mapping[int, int]) -> list[Finding]:
    """Across the effective entries of the whole log: every worker logged every epoch, epochs are
    contiguous, sids are stable and distinct within a generation, and all sequencers start each
    epoch at the previous epoch's highest counter (Mencius rebalancing)."""
    out: list[Finding] = []
    by_epoch: dict[int, list[EntrySummary]] = defaultdict(list)
    sids: dict[int, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for s in summaries:
        by_epoch[s.epoch].append(s)
        if s.sid is not None:
            sids[s.gen][s.node_id].add(s.sid)
    for gen, nodes in sorted(sids.items()):
        for node, got in sorted(nodes.items()):
            if len(got) > 1:
                out.append(
                    Finding(
                        "ordering.mencius", node, f"generation {gen}: worker {node} used sids {sorted(got)}"
                    )
                )
        owners: dict[int, list[str]] = defaultdict(list)
        for node, got in nodes.items():
            for sid in got:
                owners[sid].append(node)
        for sid, names in sorted(owners.items()):
            if len(names) > 1:
                out.append(
                    Finding(
                        "ordering.mencius",
                        f"sid {sid}",
                        f"generation {gen}: sid {sid} used by {sorted(names)}",
                    )
                )
    epochs = sorted(by_epoch)
    for prev, e in itertools.pairwise(epochs):
        if e != prev + 1:
            out.append(
                Finding(
                    "ordering.log",
                    f"epoch {prev + 1}",
                    f"epochs {prev + 1}..{e - 1} are missing from the sequencer log",
                )
            )
    last = epochs[-1] if epochs else None
    for e in epochs:
        entries = by_epoch[e]
        gen = entries[0].gen
        n = n_by_gen.get(gen, len(entries))
        loggers = sorted(s.node_id for s in entries)
        if len(loggers) != len(set(loggers)):
            out.append(
                Finding("ordering.log", f"epoch {e}", f"epoch {e}: a worker logged it twice: {loggers}")
            )
        elif len(loggers) < n:
            severity = WARNING if e == last else ERROR
            why = "still running or never decided" if e == last else "a hole in the log"
            out.append(
                Finding(
                    "ordering.log",
                    f"epoch {e}",
                    f"epoch {e} (generation {gen}) is logged by {len(loggers)} of {n} workers "
                    f"({_listed(loggers)}): {why}",
                    severity,
                )
            )
        starts = {s.node_id: s.lc_start for s in entries}
        if len(set(starts.values())) > 1:
            out.append(
                Finding(
                    "ordering.mencius",
                    f"epoch {e}",
                    f"epoch {e}: sequencers start at different counters {dict(sorted(starts.items()))} "
                    "(each epoch starts at the previous epoch's highest counter)",
                )
            )
        before = by_epoch.get(e - 1)
        if before:
            top = max(s.lc_end for s in before)
            low = min(starts.values())
            if low != top:
                out.append(
                    Finding(
                        "ordering.mencius",
                        f"epoch {e}",
                        f"epoch {e} starts at counter {low}, but epoch {e - 1} ended at counter {top}",
                    )
                )
    return out


def effective_generation(epoch: int, epoch_generations: Sequence[tuple[int, int]]) -> int:
    """The generation that ran ``epoch`` (Manifest.generation_of): the last one started at or before it."""
    gen = 0
    for first, g in epoch_generations:
        if first <= epoch:
            gen = g
    return gen


# ---- state: invariants and the serial replay --------------------------------------------------------

EntityKey = tuple[str, Key]


def check_invariants(workload_name: str, messages: Sequence[str], snapshot_id: int) -> list[Finding]:
    """Findings for what ``Workload.check_state`` reported on snapshot ``snapshot_id``."""
    return [Finding(f"invariant.{workload_name}", f"snapshot {snapshot_id}", m) for m in messages]


def _clip(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _difference(reply: Reply, serial: tuple[str, Any]) -> str:
    """How a reply differs from its serial outcome, down to the fields of a dict result."""
    status, value = serial
    if reply.status != status:
        got = _clip(decode_value(reply.result)) if reply.status == "committed" else repr(reply.error)
        return f"the reply is {reply.status} {got}, the serial replay gives {status} {_clip(value)}"
    if status != "committed":
        return f"the reply's error is {reply.error!r}, the serial replay's {value!r}"
    got = decode_value(reply.result)
    if isinstance(got, dict) and isinstance(value, dict):
        fields = sorted((k for k in got.keys() | value.keys() if got.get(k) != value.get(k)), key=str)
        shown = "; ".join(f"{k}: {_clip(got.get(k))} vs {_clip(value.get(k))}" for k in fields[:MAX_LISTED])
        return f"the result differs from the serial replay's in {len(fields)} field(s): {shown}"
    return f"the result is {_clip(got)}, the serial replay gives {_clip(value)}"


def _same_outcome(reply: Reply, serial: tuple[str, Any]) -> bool:
    status, value = serial
    if reply.status != status:
        return False
    if status == "committed":
        return bool(decode_value(reply.result) == value)
    if status == "aborted":
        return bool(reply.error == value)
    return True  # "failed": the status is the contract; internal error texts may differ


class SerialCheck:
    """The serial replay of the log, fed one (request, reply) pair at a time in commit order.

    It compares every reply with its serial outcome and, once past ``snapshot_epoch``, the serial
    state with the snapshot's. Memory: the state only (the log streams through). ``graph`` is the
    app, or a function of the epoch giving the graph version that ran it (after code updates)."""

    def __init__(
        self,
        graph: Graph | GraphAt,
        snapshot_epoch: int | None,
        snapshot_state: Mapping[EntityKey, Any] | None,
        max_findings: int = 20,
        on_commit: Callable[[Graph, Reply, Writes], None] | None = None,
    ) -> None:
        self.graph = graph
        self.on_commit = on_commit  # each committed transaction's graph, reply and writes (the changelog's)
        self.snapshot_epoch = snapshot_epoch
        self.snapshot_state = snapshot_state
        self.max_findings = max_findings
        self.state: dict[EntityKey, bytes] = {}
        self.pending = PendingByEpoch()
        self.findings: list[Finding] = []
        self.mismatched = 0
        self.replayed = 0
        self.last: tuple[int, int, int] = (-1, -1, -1)  # the commit place of the last reply replayed
        self.last_request = ""
        self.compared = snapshot_epoch is None or snapshot_state is None

    async def feed(self, request: Request, reply: Reply) -> None:
        """The next reply in commit order, with its request. ``request.ts_ms`` must be the clock the
        cluster gave the transaction (``ctx.now()``): the ingress record's timestamp. A refused reply
        (not admitted) ran nothing and is passed over."""
        if reply.status == ReplyStatus.REFUSED:
            return
        order = (reply.epoch, reply.phase, reply.tid)
        if order <= self.last:  # one place in the commit order holds one transaction
            self._out_of_order(request, reply)
            return
        self.last, self.last_request = order, reply.request_id
        if not self.compared and self.snapshot_epoch is not None and reply.epoch > self.snapshot_epoch:
            self._compare_state()
        graph = self.graph if isinstance(self.graph, Graph) else self.graph(reply.epoch)
        written: Writes = {}
        pending = self.pending.for_epoch(graph, reply.epoch)
        outcome = await apply_serially(graph, self.state, request, reply.tid, written, pending)
        self.pending.write_all(written.items())
        if self.on_commit is not None and outcome[0] == "committed":
            self.on_commit(graph, reply, written)
        self.replayed += 1
        if not _same_outcome(reply, outcome):
            self._mismatch(
                reply.request_id,
                f"reply to {reply.request_id} ({request.operator}.{request.function} on "
                f"{request.key!r}, tid {reply.tid} epoch {reply.epoch}): " + _difference(reply, outcome),
            )

    def _out_of_order(self, request: Request, reply: Reply) -> None:
        """A reply whose commit place (epoch, phase, tid) is not past the last one replayed: two
        transactions answered under one tid, or a feed out of order. Reported, and not replayed."""
        place = (reply.epoch, reply.phase, reply.tid)
        self._mismatch(
            reply.request_id,
            f"reply to {reply.request_id} ({request.operator}.{request.function} on {request.key!r}, "
            f"{reply.status}) takes the commit place (epoch, phase, tid) {place}, not after "
            f"{self.last} of the reply to {self.last_request}: one place commits one transaction",
        )

    def _mismatch(self, request_id: str, message: str) -> None:
        """A reply that is not its serial outcome: listed up to ``max_findings``, counted beyond."""
        self.mismatched += 1
        if self.mismatched <= self.max_findings:
            self.findings.append(Finding("serial.outcome", request_id, message))

    def _compare_state(self) -> None:
        self.compared = True
        assert self.snapshot_state is not None
        serial = {k: decode_value(v) for k, v in self.state.items()}
        snap = self.snapshot_state
        differ = sorted((k for k in serial.keys() | snap.keys() if serial.get(k) != snap.get(k)), key=str)
        for op, key in differ[: self.max_findings]:
            self.findings.append(
                Finding(
                    "serial.state",
                    f"{op}/{key}",
                    f"{op} {key!r}: snapshot {self.snapshot_epoch} holds {snap.get((op, key))!r}, the serial "
                    f"replay of the log up to epoch {self.snapshot_epoch} gives {serial.get((op, key))!r}",
                )
            )
        if len(differ) > self.max_findings:
            self.findings.append(
                Finding(
                    "serial.state",
                    f"snapshot {self.snapshot_epoch}",
                    f"{len(differ)} entities differ from the serial replay in all "
                    f"({len(differ) - self.max_findings} more not listed)",
                )
            )

    def finish(self) -> list[Finding]:
        if not self.compared:
            self._compare_state()
        if self.mismatched > self.max_findings:
            self.findings.append(
                Finding(
                    "serial.outcome",
                    "replies",
                    f"{self.mismatched} of {self.replayed} replies differ from the serial replay "
                    f"({self.mismatched - self.max_findings} more not listed)",
                )
            )
        return self.findings
