"""The simulation kit for users' apps (styx_py.testing.simulate, `styx simulate`, the pytest fixture).

It runs the project's bank app green under its default faults, finds the planted bug of the docs
example (a fee drawn from the process's random generator) with and without faults, reports an
invariant that does not hold, and prints a command that runs the failing seed alone, which fails the
same way. It runs the reservation app (external payment calls, timers) on the kit's payment double,
and its invariant finds a double that does not honour idempotency keys.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from styx_benchmarks.bank_sim import money_is_conserved, workload
from styx_py.testing.simulate import NO_FAULTS, Faults, Report, simulate

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


def styx_simulate(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "styx_py.cli", "simulate", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def test_styx_simulate_finds_the_docs_bug_in_its_default_seeds_and_prints_a_replay() -> None:
    styx = styx_simulate
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


RESERVATIONS = "styx_benchmarks.reservations:app"
RESERVATIONS_SIM = [
    "--workload",
    "styx_benchmarks.reservations_sim:workload",
    "--invariant",
    "styx_benchmarks.reservations_sim:no_double_charge",
]


def test_styx_simulate_runs_the_reservation_app_on_its_payment_double() -> None:
    """The app calls an external payment service and sets timers: with the kit's double in place of its
    HTTP service, it passes under crashes and reshapes, and the double's ledger holds every charge once."""
    argv = [*RESERVATIONS_SIM, "--services", "styx_benchmarks.reservations_sim:services", "--seeds", "8"]
    done = styx_simulate(RESERVATIONS, *argv)
    assert done.returncode == 0 and "8 of 8 seeds passed" in done.stdout, done.stdout + done.stderr


def test_the_reservation_invariant_finds_a_service_that_forgets_its_idempotency_keys() -> None:
    argv = [*RESERVATIONS_SIM, "--services", "tests.apps.forgetful_payments:services", "--seeds", "3"]
    done = styx_simulate(RESERVATIONS, *argv)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "seed 0 failed:\nAssertionError: the invariant does not hold: " in done.stdout, done.stdout
    assert "--services tests.apps.forgetful_payments:services" in done.stdout


def test_doubles_in_place_of_the_graphs_services_are_undone_after_each_seed() -> None:
    from styx_benchmarks import reservations, reservations_sim

    report = simulate(
        RESERVATIONS,
        reservations_sim.workload,
        seeds=[0],
        faults=NO_FAULTS,
        services=reservations_sim.services,
        invariant=reservations_sim.no_double_charge,
        requests=30,
    )
    assert report.ok, report.describe()
    assert reservations.app.services == {"payments": reservations.http_payments}


def test_the_faults_line_counts_in_words() -> None:
    assert Faults(1, 1, 1, 0, 1).describe() == (
        "1 worker crash, 1 coordinator crash, 1 lost and 0 repeated message, 1 reshape"
    )
    assert Faults().describe() == (
        "2 worker crashes, 1 coordinator crash, 1 lost and 1 repeated messages, 2 reshapes"
    )
