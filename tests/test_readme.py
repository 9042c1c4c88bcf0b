"""The README walk-through: every command of its Quickstart, run as written, does what the README says.

The commands are read from README.md itself (its ``sh`` blocks and the Python examples), so an edit
that breaks one fails here. ``make test`` is the one command not run: it is this suite (CI runs it).
The expected outputs are the README's own ``# {...}`` comments: every value written there (``…`` is
"any") must be what the command printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent  # `styx` is installed next to this interpreter

pytestmark = pytest.mark.services


def sh_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, re.S)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def commands(block: str) -> list[tuple[str, str]]:
    """``(command, comment)`` per command line of a block: continuation lines joined, comment-only
    lines folded into the comment of the command above them (the README's expected outputs)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out: list[tuple[str, str]] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            if out:
                out[-1] = (out[-1][0], out[-1][1] + " " + line.strip().lstrip("#").strip())
            continue
        command, _, comment = line.partition("  #")
        out.append((command.strip(), comment.strip()))
    return out


def expected_json(comment: str) -> dict[str, Any] | None:
    """The ``{...}`` written in a comment, ``…`` read as "any value" (None)."""
    match = re.search(r"\{.*\}", comment)
    if match is None:
        return None
    text = re.sub(r"…", "null", match.group(0))
    value: dict[str, Any] = json.loads(text)
    return value


def assert_matches(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    for key, value in expected.items():
        assert key in actual, f"{what}: no {key!r} in {actual}"
        if value is not None:
            assert actual[key] == value, f"{what}: {key} is {actual[key]!r}, the README says {value!r}"


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STYX_")}
    return {**clean, "PATH": f"{VENV_BIN}{os.pathsep}{clean.get('PATH', '')}"}


def test_make_demo_does_what_the_readme_says(tmp_path: Path) -> None:
    """``make demo``: the local cluster, the bank app, transfers, throughput, latency, money conserved.
    The install step is taken as done (this interpreter's venv is installed: ``-o`` skips it)."""
    (demo,) = [c for c, _ in commands(sh_blocks()[0]) if c.startswith("make demo")]
    venv = VENV_BIN.parent
    out = subprocess.run(
        [*demo.split(), "-f", str(ROOT / "Makefile"), f"VENV={venv}", "-o", f"{venv}/.installed"],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in (
        "coordinator",
        "kafka",
        "s3",
        "deployed styx_benchmarks.bank:app",
        "metrics coordinator",  # every process's /metrics URL
        "metrics w2",
        "txn/s",
        "latency ms: p50",
        "money conserved: 100000 == 100000: yes",
        "demo finished: OK",
        "stopped",
    ):
        assert expected in out.stdout, f"missing {expected!r} in:\n{out.stdout}"
    assert "Traceback" not in out.stderr


class Up:
    """``styx up`` in the foreground of its own process, as the README runs it; its lines collected."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=cwd,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.up = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "cluster is up" in line:
                self.up.set()
        self.up.set()  # ended: wait() below tells which

    def wait_up(self, timeout_s: float) -> None:
        self.up.wait(timeout_s)
        assert any("cluster is up" in line for line in self.lines), "".join(self.lines)

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        return "".join(self.lines)


def run_script(steps: list[str], cwd: Path, out_dir: Path) -> list[tuple[int, str]]:
    """Run ``steps`` in one bash session (``eval`` and ``GW=`` carry over to later lines); each step's
    exit code and output."""
    lines = ["set -u"]
    for i, step in enumerate(steps):
        lines.append(f"{step} > {out_dir}/{i}.out 2>&1; echo $? > {out_dir}/{i}.rc")
    subprocess.run(["bash", "-c", "\n".join(lines)], cwd=cwd, env=env(), timeout=300, check=True)
    return [
        (int((out_dir / f"{i}.rc").read_text()), (out_dir / f"{i}.out").read_text())
        for i in range(len(steps))
    ]


def test_the_quickstart_by_hand_and_the_http_examples(tmp_path: Path) -> None:
    """``styx up``, then every command below it and the gateway's curl examples, in order, as written."""
    by_hand = next(b for b in sh_blocks() if "styx up" in b and "styx deploy" in b)
    http = next(b for b in sh_blocks() if "curl" in b)
    (up_command, _), *rest = commands(by_hand)
    assert up_command.startswith("styx up")
    steps = [*rest, *commands(http)]
    up = Up(up_command, tmp_path)
    try:
        up.wait_up(180)
        results = run_script([c for c, _ in steps], tmp_path, tmp_path)
        sdk_output = run_sdk_example(tmp_path)
    finally:
        log = up.stop()
    assert "export STYX_COORDINATOR=" in log and "export STYX_GATEWAY_URL=" in log, log
    for (command, comment), (rc, output) in zip(steps, results, strict=True):
        assert rc == 0, f"{command!r} exited {rc}:\n{output}"
        expected = expected_json(comment)
        if expected is not None:
            assert_matches(json.loads(output.splitlines()[-1]), expected, command)
    by_command = {c: out for (c, _), (_, out) in zip(steps, results, strict=True)}
    status = next(out for c, out in by_command.items() if c.startswith("styx status"))
    for table in ("transactions since start", "worker  sid", "operator  partitions"):  # the README's tables
        assert table in status, status
    state = next(out for c, out in by_command.items() if "/v1/state/" in c)
    assert json.loads(state)["value"] == int(re.search(r"state function: (\d+)", http).group(1))  # type: ignore[union-attr]
    long_poll = next(out for c, out in by_command.items() if "wait_s=" in c)
    rid = re.search(r"/v1/invocations/([\w-]+)\?wait_s", http).group(1)  # type: ignore[union-attr]
    assert json.loads(long_poll)["request_id"] == rid and json.loads(long_poll)["status"] == "committed"
    # The snippet's transfer commits; its second, of a million, aborts as its comment says; the
    # blocking client reads a balance.
    lines = sdk_output.splitlines()
    assert lines[0].startswith("committed ") and "insufficient credit in alice" in lines[1], sdk_output
    assert re.fullmatch(r"\d+", lines[2]), sdk_output


def run_sdk_example(cwd: Path) -> str:
    """The README's SDK snippet as a file, run as written in the directory ``styx up`` runs in (its
    clients find the cluster there), against the running cluster."""
    snippet = next(b for b in python_blocks() if "StyxClient" in b)
    program = cwd / "sdk_example.py"
    program.write_text(snippet)
    out = subprocess.run(
        [sys.executable, str(program)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_example_app_is_a_deployable_graph() -> None:
    """The README's example is the bank app, abridged: it builds a graph with the same functions."""
    from styx_benchmarks.bank import app as bank
    from styx_py import Graph

    example = next(b for b in python_blocks() if "Graph(" in b)
    namespace: dict[str, Any] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, Graph)
    readme_functions = {name: set(op.functions) for name, op in app.operators.items()}
    bank_functions = {name: set(op.functions) for name, op in bank.operators.items()}
    for name, functions in readme_functions.items():
        assert functions <= bank_functions[name], (name, functions, bank_functions[name])
