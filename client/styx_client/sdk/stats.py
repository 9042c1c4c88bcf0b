"""What one client counts: :class:`ClientStats`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientStats"]


@dataclass(slots=True)
class ClientStats:
    """Counters of one client, for monitoring and tests (monotonic, never reset)."""

    sent: int = 0
    """Requests acknowledged by the broker (a request id shared by several callers counts once)."""
    replied: int = 0
    """Replies that resolved a pending request."""
    timeouts: int = 0
    """Waits that ended in :class:`~styx_py.core.errors.RequestTimeout` (one per waiting caller)."""
    duplicates_ignored: int = 0
    """Replies for a request id that had just been answered, by the same path (server or broker
    redelivery)."""
    pushed: int = 0
    """Of ``replied``, replies a worker pushed that came before their egress copy
    (:mod:`styx_client.sdk.push`)."""
    echoes_ignored: int = 0
    """The later copy of a reply that came both ways: pushed by a worker and read from the egress topic."""
    unmatched_ignored: int = 0
    """Replies for an id nobody waits for (another client's, or one whose caller gave up)."""
    foreign_ignored: int = 0
    """Of ``unmatched_ignored``, replies for an id this client did not send recently: another client's
    that shares its reply partition (or an answer this client gave up on long ago)."""
    rewritten: int = 0
    """Requests written again to a newer ingress segment (the workers may have stopped reading theirs)."""
    refused: int = 0
    """Of ``replied``, replies ``refused``: the cluster did not admit the request (admission control)."""
    refused_entity: int = 0
    """Of ``refused``, those refused behind their root entity's queue (a hot key): they do not narrow
    the in-flight window (:mod:`styx_client.sdk.window`), which only the cluster's backlog does."""
    shed: int = 0
    """Requests refused here, nothing sent, while the cluster refuses (:mod:`styx_client.sdk.window`)."""
    undecodable: int = 0
    """Egress records that are not a valid :class:`~styx_py.core.wire.Reply` (logged and skipped)."""
    egress_skipped: int = 0
    """Egress records the reader moved over without reading them: all replies already taken pushed
    (:mod:`styx_client.sdk.resting`)."""
