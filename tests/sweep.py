"""Seed sweeps of the simulation, beyond the seeds the test suite runs.

    python -m tests.sweep oracle 0 1000     # the random mix, call-graph caching on (even seeds) or off
    python -m tests.sweep crashes 0 500     # worker and coordinator crashes, lost and repeated messages
    python -m tests.sweep reshapes 0 300    # joins, drains, losses and crashes under load
    python -m tests.sweep effects 0 500     # external calls and timers under crashes, drops, duplicates
    python -m tests.sweep scans 0 500       # range reads against inserts and deletes, crashes, reshapes
    python -m tests.sweep reads 0 300       # consistent scans outside transactions while transfers run
    python -m tests.sweep read-crashes 0 300  # the same while workers crash and restore

Each seed runs the same scenario as the suite's tests (tests/test_oracle.py ``run_seed``,
tests/test_recovery.py ``run_with_crashes``,
tests/test_reshape.py ``run_with_reshapes``, tests/test_scan_sim.py ``scan_seed``,
tests/test_state_reads.py's scans while transfers run and under worker crashes), checked against
the serial execution; a failing seed is printed with the exception and can be replayed alone
(``python -m tests.sweep crashes 123 124``). Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback

from styx_py.testing.cluster import run_simulated
from tests.test_effects import run_effects
from tests.test_oracle import run_seed
from tests.test_recovery import run_with_crashes
from tests.test_reshape import run_with_reshapes
from tests.test_scan_sim import scan_seed
from tests.test_state_reads import scans_under_worker_crashes, scans_while_transfers_run


async def oracle(seed: int) -> None:
    await run_seed(seed, caching=seed % 2 == 0)


async def crashes(seed: int) -> None:
    await run_with_crashes(
        seed,
        crashes=1 + seed % 3,
        coordinator_crashes=(seed // 3) % 2,
        snapshot_every=1 + seed % 4,
        resends=seed % 3,
        drops=(seed // 2) % 2,
        duplicates=(seed // 5) % 2,
    )


async def reshapes(seed: int) -> None:
    await run_with_reshapes(seed)


async def effects(seed: int) -> None:
    await run_effects(
        seed,
        crashes=seed % 3,
        coordinator_crashes=(seed // 3) % 2,
        drops=(seed // 2) % 2,
        duplicates=(seed // 5) % 2,
        snapshot_every=seed % 4,
        reshapes=(seed // 4) % 3,
        update=seed % 7 == 6,
    )


async def scans(seed: int) -> None:
    await scan_seed(seed)


async def reads(seed: int) -> None:
    await scans_while_transfers_run(seed)


async def read_crashes(seed: int) -> None:
    await scans_under_worker_crashes(seed)


SCENARIOS = {
    "oracle": oracle,
    "crashes": crashes,
    "effects": effects,
    "reshapes": reshapes,
    "scans": scans,
    "reads": reads,
    "read-crashes": read_crashes,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("first", type=int)
    p.add_argument("end", type=int, help="one past the last seed")
    args = p.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the recoveries a sweep causes are its point
    scenario = SCENARIOS[args.scenario]
    failed: list[int] = []
    started = time.monotonic()
    for seed in range(args.first, args.end):
        try:
            run_simulated(scenario(seed))
        except Exception:  # noqa: BLE001 - a failing seed is reported with its traceback, and counted
            failed.append(seed)
            print(f"seed {seed} FAILED:\n{traceback.format_exc()}", flush=True)
        done = seed - args.first + 1
        if done % 25 == 0:
            print(
                f"{args.scenario}: {done} seeds in {time.monotonic() - started:.0f} s, failed {failed}",
                flush=True,
            )
    total = args.end - args.first
    passed = total - len(failed)
    print(f"{args.scenario} seeds {args.first}..{args.end - 1}: {passed} of {total} passed; failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
