"""Where an entity's intents and timers live: its owner key (styx_py.core.effectids.owner_of) is on the
entity's own partition, so asking for a call or a timer adds no partition to the transaction."""

from __future__ import annotations

import random

import msgspec

from styx_benchmarks.reservations import app
from styx_py.core.effectids import OUTBOX, TIMERS, owner_of
from styx_py.core.partitioning import partition_of
from styx_py.core.serial import apply_serially
from styx_py.core.wire import Request, encode_value


def test_an_owner_key_lives_on_its_entitys_partition() -> None:
    rng = random.Random(7)
    for own in (1, 2, 3, 4, 16):
        for system in sorted({own, 4, 16, 64} - set(range(own))):
            for i in range(200):
                key = rng.choice([f"k{i}", i, f"seat{rng.randrange(10**6)}", -i])
                owner = owner_of("op", key, own, system)
                assert partition_of(owner, system) == partition_of(key, own), (own, system, key, owner)
                assert owner == owner_of("op", key, own, system), "the same key every time"
                assert owner.split("#")[0] == owner_of("op", key) == f"op/{key!r}"


async def test_a_hold_records_its_call_and_timer_on_the_seats_partition() -> None:
    state: dict[tuple[str, str | int], bytes] = {}
    for seat in ("s0", "s1", "s2", "s3", 17):
        args = msgspec.Raw(encode_value(["ann", 5, 30.0]))
        outcome = await apply_serially(app, state, Request(f"h-{seat}", "seat", "hold", seat, args, 0), 1, {})
        assert outcome[0] == "committed", outcome
        owner = app.owner_of("seat", seat)
        assert (OUTBOX, owner) in state and (TIMERS, owner) in state
        n, system = app.operators["seat"].partitions, app.operators[OUTBOX].partitions
        assert partition_of(owner, system) == partition_of(seat, n)
