"""What a :class:`~styx_client.sdk.StyxClient` shows of itself: its settings, counters and state
(:class:`ClientView`, the client's base class, which only reads)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from styx_client.sdk.config import ClientConfig
from styx_client.sdk.core import ClientCore
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.requests import Targets
from styx_client.sdk.shell import Shell
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.transport import Batching, ClientTransport

__all__ = ["ClientView"]


class ClientView:
    """The read side of a client; :class:`~styx_client.sdk.StyxClient` sets these in its constructor."""

    config: ClientConfig
    _core: ClientCore
    _targets: Targets
    _new_rid: RequestIds
    _transport: ClientTransport
    _shell: Shell | None

    @property
    def bootstrap(self) -> str:
        return self.config.bootstrap

    @property
    def ingress_topic(self) -> str:
        return self.config.ingress_topic

    @property
    def egress_topic(self) -> str:
        return self.config.egress_topic

    @property
    def client_id(self) -> str:
        return self.config.client_id

    @property
    def max_pending(self) -> int:
        return self.config.max_pending

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    @property
    def fetch_wait_ms(self) -> int:
        return self.config.kafka.fetch_wait_ms

    @property
    def linger_ms(self) -> int:
        return self.config.kafka.linger_ms

    @property
    def busy_linger_ms(self) -> float:
        return self.config.kafka.busy_linger_ms

    @property
    def coordinator(self) -> str | None:
        """Where the worker addresses come from, for pushed replies (None: no pushes)."""
        return self.config.push.coordinator

    @property
    def push_requests(self) -> bool:
        return self.config.push.push_requests

    @property
    def rest_egress(self) -> bool:
        return self.config.push.rest_egress

    @property
    def reply_partition(self) -> int:
        """The egress partition read (-1: all), known once started."""
        return -1 if self._shell is None else self._shell.reply_partition

    @property
    def segment(self) -> int:
        """The newest ingress segment known (:mod:`styx_py.core.segments`), where requests go."""
        return self._core.segment

    @property
    def stats(self) -> ClientStats:
        return self._core.stats

    @property
    def batching(self) -> Batching:
        """How the requests sent so far were batched (all zero before :meth:`start`)."""
        return self._transport.batching

    @property
    def requests_pushed(self) -> int:
        """Requests pushed to the worker reading their partition once the broker acknowledged them
        (styx_client.sdk.push); the others are fetched only."""
        return self._transport.requests_pushed

    @property
    def operators(self) -> dict[str, int]:
        return self._targets.operators

    @property
    def functions(self) -> dict[str, frozenset[str]] | None:
        return self._targets.functions

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None:
        """The cluster runs another version of its graph (a code update): check calls against its
        operators and functions from now on. Partition counts of existing operators never change in an
        update, so requests already sent stay where they are."""
        self._targets = Targets(operators, functions)

    @property
    def request_id_prefix(self) -> str:
        """What every request id this client generates starts with: a reader of the logs can tell this
        client's requests and replies apart (ids chosen by callers need not)."""
        return self._new_rid.prefix

    @property
    def pending_count(self) -> int:
        """Requests in flight (distinct request ids waiting for a reply)."""
        return len(self._core.table)

    def is_pending(self, request_id: str) -> bool:
        """Whether ``request_id`` is in flight: a submit of it now waits for the same reply."""
        return self._core.table.get(request_id) is not None
