"""A worker's membership of the cluster: registration, heartbeats, and the lease that fences it (pure).

The worker registers with the coordinator when it starts and whenever its connection to the coordinator
breaks; its heartbeats come from its own event loop (the shell's heartbeat task), so a hung loop stops
them and counts as failed. Every message from the coordinator renews the worker's lease. A worker that
heard nothing from the coordinator for longer than the failure timeout may have been declared dead and
replaced: it must not send another reply, so the shell checks :meth:`Membership.check_lease` before every
batch of replies and ends the process when it is lost (fencing). Time is an argument: the shell reads
its clock.
"""

from __future__ import annotations

import logging

from styx_py.core.wire import Heartbeat, Message, Register

__all__ = ["Membership"]

log = logging.getLogger("styx.worker")


class Membership:
    __slots__ = (
        "coordinator_seen",
        "enabled",
        "fenced",
        "host",
        "node_id",
        "port",
        "registered_at",
        "timeout_s",
    )

    def __init__(self, node_id: str, host: str, port: int, failure_timeout_s: float, enabled: bool) -> None:
        self.node_id = node_id
        self.host, self.port = host, port
        self.timeout_s = failure_timeout_s
        self.enabled = enabled  # heartbeats and the lease (off for a worker tested on its own)
        self.coordinator_seen = -1.0  # clock time of the last word from the coordinator
        self.registered_at = -1.0  # clock time of the last Register sent
        self.fenced = False

    def start(self, now: float) -> Register:
        self.coordinator_seen = now
        return self.register(now)

    def register(self, now: float) -> Register:
        self.registered_at = now
        return Register(self.node_id, self.host, self.port)

    def heard(self, now: float) -> None:
        """A message from the coordinator: the lease is renewed."""
        self.coordinator_seen = now

    def heartbeat(
        self,
        now: float,
        completed_epoch: int,
        load: dict[int, int],
        effects: tuple[list[int], list[str]] | None = None,
    ) -> list[Message]:
        """What to send the coordinator now: a heartbeat, and a registration again when the coordinator
        said nothing for a failure timeout (its Register was lost while the coordinator restarted, so it
        does not count this worker as a member)."""
        counts, owners = effects or ([], [])
        out: list[Message] = [Heartbeat(self.node_id, completed_epoch, load, counts, owners)]
        if now - self.coordinator_seen > self.timeout_s and now - self.registered_at > self.timeout_s:
            log.warning(
                "%s: no word from the coordinator for %.1f s: registering again",
                self.node_id,
                now - self.coordinator_seen,
            )
            out.append(self.register(now))
        return out

    def check_lease(self, now: float) -> bool:
        """Fencing: True, once, when the coordinator has said nothing for longer than the failure timeout
        (:attr:`fenced` from then on): the worker must stop before it sends another reply."""
        if not self.enabled or self.fenced:
            return False
        silent_s = now - self.coordinator_seen
        if silent_s <= self.timeout_s:
            return False
        self.fenced = True
        log.critical(
            "%s: no word from the coordinator for %.0f ms: fencing myself off", self.node_id, silent_s * 1000
        )
        return True
