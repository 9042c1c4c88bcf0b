"""The `styx` command as a user runs it: as a subprocess, reading its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_fixtures import ClusterFactory

STYX = [sys.executable, "-m", "styx_py.cli"]


def styx(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STYX, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


@pytest.mark.services
def test_up_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = styx("up", "--demo", "--demo-seconds", "2", "--demo-rate", "300", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for expected in (
        "coordinator",
        "kafka",
        "s3",
        "deployed styx_py.benchmarks.bank:app",
        "metrics coordinator",  # every process's /metrics URL
        "metrics w2",
        "txn/s",
        "latency ms: p50",
        "money conserved: 100000 == 100000: yes",
        "demo finished: OK",
        "stopped",
    ):
        assert expected in text, f"missing {expected!r} in:\n{text}"
    assert "Traceback" not in out.stderr


def test_help_everywhere() -> None:
    for cmd in ([], ["up"], ["deploy"], ["call"], ["status"], ["worker"], ["coordinator"]):
        out = styx(*cmd, "--help")
        assert out.returncode == 0 and "usage: styx" in out.stdout, cmd


def test_no_cluster_is_a_readable_error(tmp_path: Path) -> None:
    out = styx("status", "--coordinator", "127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("styx: error: cannot reach the coordinator")
    assert "Traceback" not in out.stderr


@pytest.mark.services
def test_deploy_call_status(local_cluster: ClusterFactory) -> None:
    stack = local_cluster()
    bad = styx("deploy", "no.such.module:app", "--coordinator", stack.coordinator)
    assert bad.returncode == 2 and "cannot import 'no.such.module'" in bad.stderr
    ok = styx("deploy", "styx_py.benchmarks.bank:app", "--coordinator", stack.coordinator)
    assert ok.returncode == 0 and "account: 4 partitions" in ok.stdout, ok.stderr
    dep = styx("call", "account", "alice", "deposit", "100", "--coordinator", stack.coordinator)
    assert dep.returncode == 0, dep.stderr
    reply = json.loads(dep.stdout)
    assert reply["status"] == "committed" and reply["result"] == 100 and reply["tid"] >= 1
    ab = styx("call", "account", "alice", "transfer", "bob", "500", "--coordinator", stack.coordinator)
    assert ab.returncode == 3
    assert json.loads(ab.stdout)["error"].startswith("insufficient credit in alice")
    st = styx("status", "--json", "--coordinator", stack.coordinator)
    body = json.loads(st.stdout)
    assert body["graph"] == "styx_py.benchmarks.bank:app"
    assert sorted(p for w in body["workers"] for p in w["partitions"]) == [0, 1, 2, 3]
    assert body["totals"]["committed"] >= 1 and body["totals"]["aborted"] >= 1
