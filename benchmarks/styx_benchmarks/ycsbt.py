"""YCSB-T: transfers between two accounts (two reads, two writes; abort on insufficient credit).

The app is the bank app (:mod:`benchmarks.bank`): ``account.transfer`` reads and writes the source and
calls ``deposit`` on the destination, in one transaction. Keys are ``acct0 … acct{N-1}`` chosen
uniformly or Zipfian; ``multi_partition`` (0…1) forces that share of transfers to cross partitions
(the rest stay inside one), otherwise the share is whatever the key choice gives (3/4 with 4
partitions). ``--partitions`` picks the bank app over 4 (default), 16 or 64 partitions. The
invariant: money is conserved and no balance is negative.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from styx_benchmarks.bank import app_path
from styx_benchmarks.keys import KeyChooser
from styx_benchmarks.workload import Op, Options, Progress, State, Workload, read_many
from styx_py.core.partitioning import partition_of

if TYPE_CHECKING:
    from styx_client import StyxClient

INITIAL = 1_000_000
LOAD_CHUNK = 500  # accounts opened per loading transaction


def key_name(i: int) -> str:
    return f"acct{i}"


class YcsbT(Workload):
    name = "ycsbt"
    app = "styx_benchmarks.bank:app"
    description = "YCSB-T transfers between two accounts"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        o = self.options
        if o.keys < 2:
            raise ValueError(f"ycsbt needs at least 2 keys, got {o.keys}")
        if o.multi_partition is not None and not 0 <= o.multi_partition <= 1:
            raise ValueError(f"multi_partition must be in [0, 1], got {o.multi_partition}")
        self.chooser = KeyChooser(o.keys, o.zipf, seed=o.seed)
        partitions = o.partitions or 4
        self.app = app_path(partitions)
        self.partition = [partition_of(key_name(i), partitions) for i in range(o.keys)]
        by_partition: dict[int, list[int]] = {}
        for i, p in enumerate(self.partition):
            by_partition.setdefault(p, []).append(i)
        self.by_partition = by_partition
        self.names = [key_name(i) for i in range(o.keys)]  # built once, not twice per request

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        n = self.options.keys
        chunks = [[key_name(i) for i in range(s, min(n, s + LOAD_CHUNK))] for s in range(0, n, LOAD_CHUNK)]
        # The bulk function runs on the entity that receives the call; spread those over partitions.
        replies = await asyncio.gather(
            *(
                client.submit("account", f"loader{i}", "open_accounts", c, INITIAL)
                for i, c in enumerate(chunks)
            )
        )
        bad = [r for r in replies if r.status != "committed"]
        if bad:
            raise RuntimeError(f"ycsbt load failed: {bad[0].status} {bad[0].error}")
        progress(f"ycsbt: loaded {n} accounts with {INITIAL} each in {len(chunks)} transactions")

    def next_op(self, rng: random.Random) -> Op:
        o = self.options
        if o.multi_partition is None and self.chooser.cdf is None:
            # Uniform keys, the common case, drawn with one random() each instead of randrange's
            # rejection loop (its bias, at most keys / 2**53, is nil): 1.5 µs less per request.
            n, names = o.keys, self.names
            src = int(rng.random() * n)
            dst = int(rng.random() * n)
            while dst == src:
                dst = int(rng.random() * n)
            return Op("transfer", "account", names[src], "transfer", (names[dst], 1 + int(rng.random() * 10)))
        src = self.chooser.one(rng)
        if o.multi_partition is None:
            dst = self.chooser.one(rng)
            while dst == src:
                dst = self.chooser.one(rng)
        else:
            cross = rng.random() < o.multi_partition
            for _ in range(1000):
                dst = self.chooser.one(rng)
                if dst != src and (self.partition[dst] != self.partition[src]) == cross:
                    break
            else:  # the skewed chooser keeps missing: take any key of the wanted kind
                same = self.by_partition[self.partition[src]]
                pool = (
                    [i for i in range(o.keys) if self.partition[i] != self.partition[src]] if cross else same
                )
                dst = rng.choice([i for i in pool if i != src])
        return Op("transfer", "account", key_name(src), "transfer", (key_name(dst), rng.randint(1, 10)))

    async def read_state(self, client: StyxClient) -> State:
        return await read_many(
            client, (("account", key_name(i), "balance") for i in range(self.options.keys))
        )

    def check_state(self, state: State) -> list[str]:
        errors: list[str] = []
        total = 0
        for i in range(self.options.keys):
            value = state.get(("account", key_name(i)))
            if value is None:
                errors.append(f"account {key_name(i)} is missing")
                continue
            if value < 0:
                errors.append(f"account {key_name(i)} has a negative balance {value}")
            total += value
        expected = self.options.keys * INITIAL
        if total != expected:
            errors.append(
                f"money not conserved: sum of {self.options.keys} balances is {total}, expected {expected} "
                f"({total - expected:+d})"
            )
        return errors
