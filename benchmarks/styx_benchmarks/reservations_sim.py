"""The reservation app under the simulation kit (docs/simulate.md): a workload, the payment service's
double and the invariant that holds its ledger to the final state.

``styx simulate styx_benchmarks.reservations:app --workload styx_benchmarks.reservations_sim:workload
--services styx_benchmarks.reservations_sim:services --invariant
styx_benchmarks.reservations_sim:no_double_charge`` runs the app (its external payment calls and its
hold timers) under crashes and reshapes, on an in-memory payment service that is slow, fails before
taking effect and loses answers after it, with fault rates drawn from the seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from styx_benchmarks.reservations import check
from styx_benchmarks.workload import State
from styx_py.testing.services import ServiceDouble

__all__ = ["SEATS", "USERS", "no_double_charge", "payments", "services", "workload"]

SEATS, USERS = 24, 5


def payments(
    rng: random.Random, *, fail: float = 0.0, lose: float = 0.0, delay_s: float = 0.01
) -> ServiceDouble:
    """The payment service: ``charge(user, amount)`` and ``refund(charge)``, one ledger entry per
    idempotency key (:func:`styx_benchmarks.reservations.check` reads the entries' ``kind``)."""
    return ServiceDouble(
        {
            "charge": lambda who, amount: {"kind": "charge", "user": who, "amount": amount},
            "refund": lambda charge: {"kind": "refund", "charge": charge},
        },
        rng,
        fail=fail,
        lose=lose,
        delay_s=delay_s,
    )


def services(rng: random.Random) -> dict[str, ServiceDouble]:
    """One seed's services: the payment double, reliable or failing and losing a fifth of its
    answers, fast or slow."""
    fail, lose = rng.choice([0.0, 0.2]), rng.choice([0.0, 0.2])
    return {"payments": payments(rng, fail=fail, lose=lose, delay_s=rng.choice([0.001, 0.05]))}


def workload(rng: random.Random) -> Iterator[tuple[str, str, str, tuple[Any, ...]]]:
    """Holds on random seats by a few users; short holds (their timers race the payments) and long
    ones (the payment's outcome comes first)."""
    i = 0
    while True:
        ttl = rng.choice([0.0, 0.02, 30.0])
        yield ("seat", f"s{rng.randrange(SEATS)}", "hold", (f"u{i % USERS}", rng.randint(1, 100), ttl))
        i += 1


def no_double_charge(state: State, doubles: dict[str, ServiceDouble]) -> Iterator[str]:
    """:func:`~styx_benchmarks.reservations.check` on the final state and the payment ledger: no
    double charge, every hold ended, every charge kept by a sold seat or refunded."""
    try:
        check(state, doubles["payments"].ledger)
    except AssertionError as exc:
        yield str(exc) or "the reservation check failed"
