"""Where the state as of an epoch comes from: the snapshot chain in S3, the changelog topic, or both
(pure: no Spark, no I/O), and the errors of ``styx sql``.

The cluster keeps one snapshot manifest: for each partition the objects that rebuild it, a compacted
base (the whole partition as of its epoch) and then one delta per later snapshot
(:class:`~styx_py.core.wire.Manifest`). Every snapshot writes a delta for every partition, so the
objects with epoch ``<= s`` rebuild the state as of ``s`` for every epoch ``s`` at which each
partition's chain holds an object (:func:`chain_epochs`). The state as of epoch ``E``
(:func:`plan_state`) is then:

* the chain up to ``S``, the newest such epoch ``<= E``, when ``S == E``;
* the chain up to ``S``, and the changelog's records of epochs ``S < epoch <= E`` applied on top;
* with no such ``S`` (``E`` before the chain), the changelog's records of epochs ``<= E`` alone:
  read from its start, the changelog is the whole history (the cluster must have run with it since
  its deploy, and no broker may have compacted it yet).

Without ``E`` the state is the newest snapshot's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from styx_py.core.blobs import epoch_of
from styx_py.core.errors import StyxError

__all__ = [
    "ENABLE_CHANGELOG",
    "AsOfUnavailable",
    "ChangelogDisabled",
    "SqlError",
    "SqlSyntaxError",
    "StatePlan",
    "UnknownTable",
    "chain_epochs",
    "plan_state",
]

ENABLE_CHANGELOG = (
    "to turn the changelog on, run the cluster with STYX_CHANGELOG_TOPIC set (e.g. styx-changelog, in "
    "every process's environment; the coordinator creates the topic at deploy), then pass "
    "--changelog-topic or set STYX_CHANGELOG_TOPIC here"
)


class SqlError(StyxError):
    """``styx sql`` could not answer (exit code 2); the message says why and what to do."""


class UnknownTable(SqlError):
    """The query names a table that is neither an operator with state nor a log table."""


class SqlSyntaxError(SqlError):
    """Spark could not parse the query (the message is Spark's, shortened)."""


class AsOfUnavailable(SqlError):
    """No source holds the state as of the epoch asked for: it is before the oldest snapshot the
    bucket holds and there is no changelog, or it has not run yet."""


class ChangelogDisabled(SqlError):
    """The epoch asked for lies after a snapshot, and the changelog that would bring the state from
    there to the epoch is off (no topic given, or the topic does not exist)."""


@dataclass(frozen=True, slots=True)
class StatePlan:
    """What to read for the state as of ``epoch``."""

    epoch: int
    snapshot: int | None  # read the chain's objects with epoch <= this; None: no snapshot objects
    changelog_after: int | None  # read changelog records of epochs in (changelog_after, epoch]; None: none

    def describe(self) -> str:
        """Which path the read takes, in words (for the progress line and the docs)."""
        if self.changelog_after is None:
            return f"the state as of epoch {self.epoch}: snapshot {self.snapshot}"
        if self.snapshot is None:
            return f"the state as of epoch {self.epoch}: the changelog's records of epochs 0..{self.epoch}"
        return (
            f"the state as of epoch {self.epoch}: snapshot {self.snapshot}, then the changelog's records "
            f"of epochs {self.changelog_after + 1}..{self.epoch}"
        )


def chain_epochs(deltas: Mapping[int, Sequence[str]]) -> list[int]:
    """The epochs whose state the chain rebuilds: those at which every partition's chain holds an
    object (its base or a delta), ascending."""
    epochs: set[int] | None = None
    for names in deltas.values():
        have = {epoch_of(n) for n in names}
        epochs = have if epochs is None else epochs & have
    return sorted(epochs or ())


def plan_state(
    manifest_epoch: int | None,
    chain: Sequence[int],
    as_of: int | None,
    changelog_off: str | None,
    bucket: str = "styx-snapshots",
) -> StatePlan:
    """The plan for the state as of ``as_of`` (None: the newest snapshot), given the manifest's epoch
    (None: no snapshot yet), its :func:`chain_epochs` and why there is no changelog to read (None:
    there is one)."""
    if as_of is None:
        if manifest_epoch is None:
            raise AsOfUnavailable(
                f"no snapshot in bucket {bucket!r} yet: the operator tables are the newest snapshot's "
                "state; wait for one, or pass --as-of-epoch E to read the changelog up to E"
            )
        return StatePlan(manifest_epoch, manifest_epoch, None)
    if as_of < 0:
        raise AsOfUnavailable(f"--as-of-epoch must be an epoch (0 or more), got {as_of}")
    older = [s for s in chain if s <= as_of]
    if older:
        s = older[-1]
        if s == as_of:
            return StatePlan(as_of, s, None)
        if changelog_off is not None:
            raise ChangelogDisabled(
                f"epoch {as_of} is no snapshot epoch (the bucket rebuilds epochs {_listed(chain)}); the "
                f"state as of {as_of} is snapshot {s} plus the changelog's records of epochs "
                f"{s + 1}..{as_of}, and there is no changelog ({changelog_off}): {ENABLE_CHANGELOG}"
            )
        return StatePlan(as_of, s, s)
    if changelog_off is not None:
        first = f"the oldest snapshot bucket {bucket!r} holds is epoch {chain[0]}" if chain else "no snapshot"
        raise AsOfUnavailable(
            f"epoch {as_of} is before the snapshots ({first}; older ones are compacted away) and there "
            f"is no changelog to read it from ({changelog_off}): {ENABLE_CHANGELOG}"
        )
    return StatePlan(as_of, None, -1)


def _listed(epochs: Sequence[int], most: int = 12) -> str:
    shown = ", ".join(str(e) for e in epochs[-most:])
    return shown if len(epochs) <= most else f"…, {shown}"
