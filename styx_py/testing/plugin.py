"""Pytest plugin: the simulation kit (:mod:`styx_py.testing.simulate`) as a fixture.

In your ``conftest.py``: ``pytest_plugins = ["styx_py.testing.plugin"]``; then, in a (synchronous) test::

    def test_my_bank_under_faults(styx_simulation):
        styx_simulation("myapp.bank:app", workload, seeds=range(50), invariant=money_is_conserved)

A failing seed fails the test with the seed, what failed and how to run it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from styx_py.testing.simulate import Report, Workload, simulate

__all__ = ["styx_simulation"]


@pytest.fixture
def styx_simulation() -> Callable[..., Report]:
    """``styx_simulation(app, workload, **options)``: :func:`~styx_py.testing.simulate.simulate`, failing
    the test when a seed fails."""

    def run(app: str, workload: Workload, **options: Any) -> Report:
        report = simulate(app, workload, **options)
        if not report.ok:
            pytest.fail(report.describe(), pytrace=False)
        return report

    return run
