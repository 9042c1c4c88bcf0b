"""Deploy-time warnings about calls a replay does not reproduce (styx_py.core.determinism)."""

from __future__ import annotations

import re

from styx_py.core.determinism import nondeterminism_warnings
from styx_py.core.graph import load_graph
from styx_py.testing.cluster import SimCluster


def _calls(warnings: list[str], function: str) -> list[str]:
    return [m.group(1) for w in warnings if (m := re.search(rf"thing\.{function} calls (\S+)\(\)", w))]


def test_each_usual_spelling_is_named_with_its_line_and_replacement() -> None:
    warnings = nondeterminism_warnings(load_graph("tests.apps.suspicious:app"))
    assert sorted(_calls(warnings, "module_calls")) == [
        "datetime.datetime.now",
        "os.urandom",
        "random.random",
        "secrets.token_hex",
        "time.time",
        "uuid.uuid4",
    ]
    assert sorted(_calls(warnings, "imported_names")) == ["dt.utcnow", "hash", "randint"]
    assert _calls(warnings, "clean") == [], "ctx.random/now/uuid and formatting are deterministic"
    first = next(w for w in warnings if "random.random" in w)
    assert re.match(r".*tests/apps/suspicious\.py:\d+: thing\.module_calls calls random\.random\(\)", first)
    assert first.endswith("use ctx.random()")


def test_the_shipped_apps_are_clean() -> None:
    for path in (
        "styx_benchmarks.bank:app",
        "styx_benchmarks.tpcc:app",
        "styx_benchmarks.deathstar:hotel_app",
        "styx_benchmarks.deathstar:movie_app",
        "tests.apps.oracle:app",
    ):
        assert nondeterminism_warnings(load_graph(path)) == [], path


async def test_the_coordinator_reports_them_at_deploy() -> None:
    async with SimCluster("tests.apps.nondeterministic:app", workers=2) as c:
        [warning] = c.coordinator.status()["warnings"]
        assert "counter.bump calls random.random()" in warning and "nondeterministic.py:" in warning
