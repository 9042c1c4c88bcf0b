"""How long a worker's snapshot holds its event loop at once, on a delta of realistic size.

    python -m styx_benchmarks.snapshot_hold                       # 5 000 writes, 10 000 replies
    python -m styx_benchmarks.snapshot_hold --writes 20000 --replies 40000 --repeat 5

A snapshot's cut happens at an epoch boundary and delays that epoch's ``EpochDone`` (and so the
cluster's next epoch) by as long as it runs; every later piece of work runs between epochs and delays
whatever the loop would have done meanwhile. This times, on the process's CPU clock, the work of one
snapshot of two partitions (one worker of the local stack) done as the worker did it before, at once
(the split by partition at the cut, then each part's encoding in one call), and in steps
(:func:`~styx_worker.snapshot.capture_steps`, :func:`~styx_worker.snapshot.encode_steps`): the
cut, and the longest step. It checks that both give the same bytes. Writes are YCSB-T accounts, replies
are committed transfers with 32-character request ids (YCSB-T at 2 000/s for 10 s gives each worker of
the local stack ~5 000 written accounts and ~10 000 replies).

Measured numbers are in benchmarks/results/snapshot-stall.md.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec

from styx_py.core.config import load_config
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import PartitionSnapshot, Phase, Reply, ReplyStatus
from styx_py.io.runtime import steady_gc
from styx_worker.snapshot import Steps, capture_steps, encode_steps, run_steps
from styx_worker.state import Writes

T = TypeVar("T")
PARTITIONS = {"ycsb": 4}
OWNED = [0, 2]  # a worker of the local stack: two of the four partitions
_encoder = msgspec.msgpack.Encoder()


def workload(writes: int, replies: int) -> tuple[Writes, dict[int, list[Reply]]]:
    """A worker's delta and replies: ``writes`` accounts of its partitions, ``replies`` transfers."""
    delta: Writes = {}
    key = 0
    while len(delta) < writes:
        if partition_of(key, 4) in OWNED:
            delta["ycsb", key] = _encoder.encode(1_000 + key % 97)
        key += 1
    by_partition: dict[int, list[Reply]] = {p: [] for p in OWNED}
    nil = msgspec.Raw(_encoder.encode(None))
    for i in range(replies):
        reply = Reply(f"{i:032x}", i, i // 50, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, nil, None, None, 17)
        by_partition[OWNED[i % len(OWNED)]].append(reply)
    return delta, by_partition


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.process_time()
    out = fn()
    return time.process_time() - started, out


def longest_step(steps_of: Callable[[], Steps[object]]) -> tuple[float, float]:
    """The longest step and the total of the steps made by ``steps_of``, in seconds of CPU."""
    steps = steps_of()
    longest = total = 0.0
    while True:
        started = time.process_time()
        try:
            next(steps)
        except StopIteration:
            done = True
        else:
            done = False
        spent = time.process_time() - started
        longest, total = max(longest, spent), total + spent
        if done:
            return longest, total


def measure(writes: int, replies: int, rows: int) -> dict[str, float]:
    delta, by_partition = workload(writes, replies)

    def steps() -> Steps[list[PartitionSnapshot]]:
        return capture_steps(1, delta, PARTITIONS, OWNED, {}, [], {}, 0, by_partition, [], rows)

    cut_s, _ = timed(steps)
    split_s, done = timed(lambda: run_steps(steps()))
    encodes = [timed(functools.partial(_encoder.encode, part)) for part in done]
    step_longest, step_total = longest_step(steps)
    for part, (_, at_once) in zip(done, encodes, strict=True):
        longest, total = longest_step(functools.partial(encode_steps, part, rows))
        step_longest, step_total = max(step_longest, longest), step_total + total
        if run_steps(encode_steps(part, rows)) != at_once:
            raise SystemExit("snapshot_hold: a part encoded in steps differs from the part encoded at once")
    return {
        "at_once_cut_ms": split_s * 1e3,  # the split ran at the cut
        "at_once_longest_ms": max([split_s, *(s for s, _ in encodes)]) * 1e3,
        "at_once_total_ms": (split_s + sum(s for s, _ in encodes)) * 1e3,
        "steps_cut_ms": cut_s * 1e3,
        "steps_longest_ms": step_longest * 1e3,
        "steps_total_ms": step_total * 1e3,
        "bytes": sum(len(b) for _, b in encodes),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=5_000, help="accounts written since the last snapshot")
    ap.add_argument("--replies", type=int, default=10_000, help="replies given since the last snapshot")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the median of each figure is shown")
    ap.add_argument(
        "--rows",
        type=int,
        default=load_config(env={}).snapshot_step_rows,
        help="rows per step (default: the snapshot_step_rows setting's)",
    )
    args = ap.parse_args(argv)
    with steady_gc():  # as in a worker
        runs = [measure(args.writes, args.replies, args.rows) for _ in range(args.repeat)]
    median = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    print(
        f"snapshot of {args.writes} writes and {args.replies} replies over {len(OWNED)} partitions "
        f"({median['bytes'] / 1e3:.0f} KB), median of {args.repeat}, ms of CPU:"
    )
    print(
        f"  at once:  at the cut {median['at_once_cut_ms']:.2f}, longest hold "
        f"{median['at_once_longest_ms']:.2f}, in all {median['at_once_total_ms']:.2f}"
    )
    print(
        f"  in steps: at the cut {median['steps_cut_ms']:.3f}, longest step "
        f"{median['steps_longest_ms']:.2f}, in all {median['steps_total_ms']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
