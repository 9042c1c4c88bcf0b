"""The simulation kit for users' apps (styx_py.testing.simulate, `styx simulate`, the pytest fixture).

It runs the project's bank app green under its default faults, finds the planted bug of the docs
example (a fee drawn from the process's random generator) with and without faults, reports an
invariant that does not hold, and prints a command that runs the failing seed alone, which fails the
same way.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from styx_benchmarks.bank_sim import money_is_conserved, workload
from styx_py.testing.simulate import NO_FAULTS, Report, simulate

pytest_plugins = ["styx_py.testing.plugin"]

BANK, BUGGY, BROKEN = (
    "styx_benchmarks.bank:app",
    "styx_benchmarks.bank_sim:buggy_app",
    "tests.apps.broken_bank:app",
)
WORKLOAD, INVARIANT = "styx_benchmarks.bank_sim:workload", "styx_benchmarks.bank_sim:money_is_conserved"


def test_the_bank_passes_under_crashes_reshapes_and_lost_messages(
    styx_simulation: Callable[..., Report],
) -> None:
    report = styx_simulation(BANK, workload, seeds=range(20), invariant=money_is_conserved)
    assert report.ok and len(report.results) == 20
    assert all(r.replies >= 190 for r in report.results), "the workload's calls were not all answered"
    assert sum(r.crashes for r in report.results) >= 20, "the faults did not fire"


def test_the_planted_bug_is_found_with_faults_and_without() -> None:
    """The fee comes from the process's random generator: money is conserved (it goes to ``fees``), so
    only the comparison with a serial execution can see it, after a crash (the replay diverges and the
    cluster stops) and without one (the serial execution draws other fees)."""
    for faults in (None, NO_FAULTS):
        options: dict[str, Any] = {} if faults is None else {"faults": faults}
        report = simulate(BUGGY, workload, seeds=range(5), invariant=money_is_conserved, **options)
        assert not report.ok and report.failed[0].seed in range(5)
        error = report.failed[0].error
        assert "account.transfer" in error or "serial" in error, error
    assert "ctx.random()" in simulate(BUGGY, workload, seeds=[0]).failed[0].error


def test_an_invariant_that_does_not_hold_is_named() -> None:
    report = simulate(BROKEN, workload, seeds=[0], faults=NO_FAULTS, invariant=money_is_conserved)
    [result] = report.results
    assert not result.ok and "the invariant does not hold: the accounts hold" in result.error


def test_styx_simulate_finds_the_docs_bug_in_its_default_seeds_and_prints_a_replay() -> None:
    def styx(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "styx_py.cli", "simulate", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)

    done = styx(BUGGY, "--workload", WORKLOAD, "--invariant", INVARIANT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "of 100 seeds passed" in done.stdout
    replay = next(line for line in done.stdout.splitlines() if line.startswith("run it alone: "))
    argv = replay.removeprefix("run it alone: styx simulate ").split()
    again = styx(*argv)
    assert again.returncode == 1 and "0 of 1 seed passed" in again.stdout
    failure = done.stdout.split("failed:\n", 1)[1].split("\nrun it alone")[0]
    assert failure in again.stdout, "the seed did not fail the same way alone"

    green = styx(BANK, "--workload", WORKLOAD, "--invariant", INVARIANT, "--seeds", "10")
    assert green.returncode == 0 and "10 of 10 seeds passed" in green.stdout, green.stdout + green.stderr


def test_a_bad_workload_path_is_one_line() -> None:
    argv = [sys.executable, "-m", "styx_py.cli", "simulate", BANK, "--workload", "no.such:thing"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.startswith("styx: error: --workload 'no.such:thing'")
