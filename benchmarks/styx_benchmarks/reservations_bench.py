"""The reservation workload: seat holds that charge through the HTTP payment service, beside YCSB-T.

    styx bench reservations --rate 3000 --hold-share 0.3333 --payments-ms 100  # 1000 holds + 2000 transfers/s
    styx bench reservations --rate 2000 --hold-share 0                         # the transfers alone

One graph holds the bank's ``account`` operator (:mod:`styx_benchmarks.bank`) and the reservation app's
``seat`` and ``user`` (:mod:`styx_benchmarks.reservations`). A share ``hold_share`` of the requests are
``seat.hold`` on a fresh seat (each one an external call to the payment service, its continuation and a
timer the continuation cancels); the rest are YCSB-T transfers, which make no external call. The
per-kind latency of the results (``transfer``, ``hold``) shows what the external load costs the
transactions that have nothing to do with it; ``hold_share`` 0 is the run without external calls.

A cluster that ``styx bench`` starts gets its own payment service, a process answering after
``payments_ms`` (:meth:`Reservations.services`); against a running cluster
(``--coordinator``), start one by hand (docs/effects.md) and give it ``RESERVATIONS_PAYMENTS_URL``.
The check: YCSB-T's, and once every hold has ended, the reservation app's against the service's ledger.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from styx_benchmarks import bank, reservations
from styx_benchmarks.workload import Op, Options, State, read_many
from styx_benchmarks.ycsbt import YcsbT
from styx_py import Graph
from styx_py.io import lifeline

if TYPE_CHECKING:
    from styx_client import StyxClient

HOLD_TTL_S = 120.0  # longer than a run: each hold ends by its payment's outcome, the timer is cancelled
USERS = 1000
SETTLE_S = 60.0  # how long the check waits for the holds still under way to end

app = Graph(
    "reservations_bench",
    [bank.account, reservations.seat, reservations.user],
    services={"payments": reservations.http_payments},
)


class Reservations(YcsbT):
    name = "reservations"
    description = "seat holds charged through an external payment service, beside YCSB-T transfers"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.app = "styx_benchmarks.reservations_bench:app"
        self.hold_share = float(self.options.extra.get("hold_share", 1 / 3))
        self.payments_ms = float(self.options.extra.get("payments_ms", 1.0))
        if not 0 <= self.hold_share <= 1:
            raise ValueError(f"hold_share must be in [0, 1], got {self.hold_share}")
        self.seats = 0  # holds drawn so far: each takes the next seat
        self.service_pid: int | None = None  # the payment service's process while services() runs

    @contextlib.contextmanager
    def services(self) -> Iterator[dict[str, str]]:
        """The payment service, a process of its own, for a cluster started here: its environment."""
        from styx_py.stack.net import free_port

        port = free_port()
        argv = [sys.executable, "-m", "styx_benchmarks.payments", "--port", str(port)]
        service = lifeline.popen([*argv, "--delay-ms", str(self.payments_ms)])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:  # polling the service until it answers, bounded by the deadline
                try:
                    httpx.get(f"{url}/stats", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    if service.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the payment service did not start") from None
                    time.sleep(0.1)
            self.url = url
            self.service_pid = service.pid
            yield {reservations.PAYMENTS_URL_ENV: url}
        finally:
            self.service_pid = None
            service.terminate()
            service.wait(10)

    def service_pids(self) -> dict[str, int]:
        return {} if self.service_pid is None else {"payments": self.service_pid}

    def next_op(self, rng: random.Random) -> Op:
        if rng.random() >= self.hold_share:
            return super().next_op(rng)
        n = self.seats
        self.seats += 1
        return Op("hold", "seat", f"seat{n}", "hold", (f"user{n % USERS}", 1 + n % 50, HOLD_TTL_S))

    async def read_state(self, client: StyxClient) -> State:
        accounts = await super().read_state(client)
        deadline = time.monotonic() + SETTLE_S
        while True:  # the holds' payments end after their replies: wait (bounded) until none is held
            seats = await read_many(client, (("seat", f"seat{i}", "look") for i in range(self.seats)))
            held = sum(1 for s in seats.values() if s is not None and s["state"] == "held")
            if not held or time.monotonic() > deadline:
                break
        users = await read_many(client, (("user", f"user{i}", "look") for i in range(min(self.seats, USERS))))
        written = {**seats, **users}  # a hold refused (overload) wrote no seat
        return {**accounts, **{k: v for k, v in written.items() if v is not None}}

    def check_state(self, state: State) -> list[str]:
        errors = super().check_state({k: v for k, v in state.items() if k[0] == "account"})
        held = [k for (op, k), s in state.items() if op == "seat" and s["state"] == "held"]
        if held:
            errors.append(f"{len(held)} seats still held {SETTLE_S:g} s after the run, e.g. {held[:3]}")
        return errors

    async def check(self, client: StyxClient) -> list[str]:
        state = await self.read_state(client)
        errors = self.check_state(state)
        url = getattr(self, "url", None) or os.environ.get(reservations.PAYMENTS_URL_ENV)
        if errors or not url:
            return errors
        async with httpx.AsyncClient(timeout=60) as http:
            ledger: dict[str, Any] = (await http.get(f"{url}/ledger")).json()
        twice = [k for k, v in ledger.items() if v["effects"] != 1]
        if twice:
            errors.append(f"{len(twice)} ledger keys took effect more than once, e.g. {twice[:3]}")
        try:
            reservations.check({k: v for k, v in state.items() if k[0] != "account"}, ledger)
        except AssertionError as exc:
            errors.append(f"reservations: {exc}")
        return errors
