"""The `styx` command as a user runs it: as a subprocess, reading its output."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest

from styx_py.cli import build_parser, format_status, use_cluster_file
from styx_py.io.clusterfile import ClusterFile
from styx_py.stack.net import can_bind, free_port, preferred_port
from tests.service_fixtures import ClusterFactory

STYX = [sys.executable, "-m", "styx_py.cli"]
BANK = "styx_benchmarks.bank:app"


def styx(
    *args: str, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STYX, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def test_help_everywhere() -> None:
    commands = [[], ["up"], ["deploy"], ["call"], ["status"], ["worker"], ["coordinator"], ["env"]]
    for cmd in [*commands, ["invocations"], ["invocations", "get"]]:
        out = styx(*cmd, "--help")
        assert out.returncode == 0 and "usage: styx" in out.stdout, cmd


def test_no_cluster_is_a_readable_error(tmp_path: Path) -> None:
    out = styx("status", "--coordinator", "127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("styx: error: cannot reach the coordinator")
    assert "Traceback" not in out.stderr


def test_call_arguments_are_json_or_bare_words_and_a_typo_is_an_error(tmp_path: Path) -> None:
    from styx_py.cli import _parse_arg

    assert [_parse_arg(a) for a in ("10", "bob", '"1O"', "[1, 2]", "alice-2", "true", "truex")] == [
        10, "bob", "1O", [1, 2], "alice-2", True, "truex"
    ]  # fmt: skip
    out = styx("call", "account", "alice", "deposit", "1O", "--coordinator", "127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("styx: error: argument '1O' is not valid JSON"), out.stderr


@pytest.mark.parametrize("rate", ["0", "-5", "nan", "fast"])
def test_a_listing_pace_that_is_not_a_positive_rate_is_one_line(tmp_path: Path, rate: str) -> None:
    out = styx("state", "list", "account", "--rows-per-s", rate, "--coordinator", "127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "argument --rows-per-s: expected a number of rows a second above 0" in out.stderr, out.stderr


def test_an_address_without_a_port_is_one_line(tmp_path: Path) -> None:
    for address in ("127.0.0.1", "localhost:http", "::1:6000", "127.0.0.1:70000", "127.0.0.1:0"):
        out = styx("status", "--coordinator", address, cwd=tmp_path)
        assert out.returncode == 2, (address, out.stderr)
        assert out.stderr.strip().count("\n") == 0 and "is not HOST:PORT" in out.stderr, (address, out.stderr)
    out = styx("status", cwd=tmp_path, env={"STYX_COORDINATOR": "127.0.0.1"})  # from the environment
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "'127.0.0.1' is not HOST:PORT" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("argv", "option", "expected"),
    [
        (["coordinator", "--kafka", "127.0.0.1"], "--kafka", "is not HOST:PORT[,HOST:PORT…]"),
        (["worker", "--id", "w1", "--coordinator", "127.0.0.1"], "--coordinator", "is not HOST:PORT"),
        (["worker", "--id", "w1", "--kafka", "k:9092,k2"], "--kafka", "is not HOST:PORT[,HOST:PORT…]"),
        (["gateway", "--coordinator", "c:x"], "--coordinator", "is not HOST:PORT"),
        (["deploy", "--coordinator", "c", "m:g"], "--coordinator", "is not HOST:PORT"),
        (["scale", "--coordinator", "c", "--workers", "2"], "--coordinator", "is not HOST:PORT"),
        (["call", "--kafka", "k", "--app", "m:g", "a", "1", "f"], "--kafka", "is not HOST:PORT[,HOST:PORT…]"),
        (["bench", "ycsbt", "--coordinator", "c"], "--coordinator", "is not HOST:PORT"),
        (["bench", "ycsbt", "--kafka", "k:"], "--kafka", "is not HOST:PORT[,HOST:PORT…]"),
        (["bench", "ycsbt", "--gateway", "127.0.0.1:8080"], "--gateway", "is not an http:// or https:// URL"),
        (["invocations", "list", "--gateway", "gw:8080"], "--gateway", "is not an http:// or https:// URL"),
        (["console", "--gateway", "http://gw:port"], "--gateway", "is not an http:// or https:// URL"),
    ],
)
def test_every_address_option_is_checked_before_anything_runs(
    tmp_path: Path, argv: list[str], option: str, expected: str
) -> None:
    """A malformed address option is refused by the parser: one line naming the option, the value and
    the form expected, exit 2, before a process starts, a cluster is brought up or a connection tried."""
    out = styx(*argv, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.strip().splitlines()
    command = " ".join(argv[:2]) if argv[0] == "invocations" else argv[0]
    assert line.startswith(f"styx {command}: error: argument {option}: "), line
    assert expected in line and line.endswith(f"(see 'styx {command} --help')"), line


def test_a_port_that_is_not_a_coordinator_fails_with_a_reason(tmp_path: Path) -> None:
    """A port that takes the connection and says nothing (another server, a proxy), or an HTTP server
    (which waits for a request): the connect timeout (STYX_CONNECT_TIMEOUT_S, here 0.5 s) ends the
    wait, and the error names the address and what was expected, not an empty reason after the
    request's 60 s."""
    import http.server
    import threading

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        serving = threading.Thread(target=http_server.serve_forever, daemon=True)
        serving.start()
        try:
            for port in (silent.getsockname()[1], http_server.server_address[1]):
                address = f"127.0.0.1:{port}"
                out = styx(
                    "status", "--coordinator", address, cwd=tmp_path, env={"STYX_CONNECT_TIMEOUT_S": "0.5"}
                )
                assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
                [line] = out.stderr.strip().splitlines()
                assert f"{address} took the connection but sent no handshake within 0.5 s" in line, line
                assert "is it a styx-py coordinator's port?" in line, line
        finally:
            http_server.shutdown()
            http_server.server_close()
    out = styx("status", "--coordinator", "127.0.0.1:1", cwd=tmp_path, env={"STYX_CONNECT_TIMEOUT_S": "soon"})
    assert out.returncode == 2 and "STYX_CONNECT_TIMEOUT_S='soon' is not a number of seconds" in out.stderr


def test_the_connect_timeout_defaults_to_the_handshake_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from styx_py.core.config import load_config
    from styx_py.core.limits import HANDSHAKE_TIMEOUT_S
    from styx_py.io.admin import connect_timeout

    monkeypatch.delenv("STYX_CONNECT_TIMEOUT_S", raising=False)
    assert connect_timeout(None) == HANDSHAKE_TIMEOUT_S == load_config(env={}).connect_timeout_s
    monkeypatch.setenv("STYX_CONNECT_TIMEOUT_S", "2.5")
    assert connect_timeout(None) == 2.5 == load_config().connect_timeout_s and connect_timeout(1) == 1


@pytest.mark.services
def test_deploy_call_status(local_cluster: ClusterFactory) -> None:
    stack = local_cluster()
    bad = styx("deploy", "no.such.module:app", "--coordinator", stack.coordinator)
    assert bad.returncode == 2 and "cannot import 'no.such.module'" in bad.stderr
    ok = styx("deploy", "styx_benchmarks.bank:app", "--coordinator", stack.coordinator)
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
    assert body["graph"] == "styx_benchmarks.bank:app"
    assert sorted(p for w in body["workers"] for p in w["partitions"]) == [0, 1, 2, 3]
    assert body["totals"]["committed"] >= 1 and body["totals"]["aborted"] >= 1


# ---- styx up: stable ports, printed settings, the cluster file the other commands read ----------------


def _listening_socket() -> socket.socket:
    """A socket listening on a free loopback port: the port is taken for as long as it stays open."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    return sock


def _exports(text: str) -> dict[str, str]:
    """The ``export NAME=value`` lines of ``text``, as a POSIX shell would read them."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = shlex.split(value)[0]
    return out


@pytest.mark.services
def test_up_prints_settings_that_every_command_finds(tmp_path: Path) -> None:
    """``styx up`` falls back from a taken port and says so, prints the endpoints and S3 keys as export
    lines (not the cluster secret), and leaves them in .styx/cluster.json: status, call, invocations get,
    env and the SDK find the cluster from there; a shell elsewhere gets the same through ``styx env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STYX_")}
    taken = _listening_socket()
    port = taken.getsockname()[1]
    up = subprocess.Popen(
        [*STYX, "up", "--app", "styx_benchmarks.bank:app", "--coordinator-port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    lines: list[str] = []
    try:
        for line in up.stdout:  # blocks until styx up prints; ends if it exits
            lines.append(line)
            if line.startswith("cluster is up"):
                break
        printed = "".join(lines)
        assert "cluster is up" in printed, printed
        assert f"note: coordinator: port {port} is taken, using " in printed
        exports = _exports(printed)
        state = tmp_path / ".styx" / "cluster.json"
        assert state.stat().st_mode & 0o777 == 0o600
        saved = json.loads(state.read_text())["env"]
        secret = saved.pop("STYX_CLUSTER_SECRET")
        assert exports == saved and secret not in printed
        assert set(exports) == {
            "STYX_COORDINATOR",
            "STYX_KAFKA_BOOTSTRAP",
            "STYX_GATEWAY_URL",
            "STYX_S3_ENDPOINT",
            "STYX_S3_ACCESS_KEY",
            "STYX_S3_SECRET_KEY",
            "STYX_S3_REGION",
        }
        assert exports["STYX_COORDINATOR"] != f"127.0.0.1:{port}"
        assert f"  coordinator          {exports['STYX_COORDINATOR']}" in printed

        def here(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*STYX, *args], cwd=tmp_path, env=env, capture_output=True, text=True)

        second = here("up")  # would overwrite the running one's file
        assert second.returncode == 2 and "already runs from this directory" in second.stderr
        status = here("status")
        assert status.returncode == 0, status.stderr
        assert "{" not in status.stdout  # tables, not Python dicts
        assert re.search(r"^committed +aborted +rejected +fallback +rescheduled$", status.stdout, re.M)
        assert re.search(r"^account +4 +balance, deposit", status.stdout, re.M), status.stdout
        assert here("call", "account", "alice", "deposit", "100").returncode == 0

        gateway = exports["STYX_GATEWAY_URL"]
        for key, amount in (("pay-ok", 30), ("pay-no", 10_000)):
            request = urllib.request.Request(
                f"{gateway}/v1/invocations",
                data=json.dumps(
                    {"operator": "account", "key": "alice", "function": "transfer", "args": ["bob", amount]}
                ).encode(),
                headers={"content-type": "application/json", "idempotency-key": key},
            )
            with contextlib.suppress(urllib.error.HTTPError), urllib.request.urlopen(request, timeout=60):
                pass
        ok = here("invocations", "get", "pay-ok")
        assert ok.returncode == 0 and json.loads(ok.stdout)["result"] == 70, ok.stdout + ok.stderr
        no = here("invocations", "get", "pay-no")
        assert no.returncode == 3 and json.loads(no.stdout)["status"] == "aborted", no.stdout + no.stderr
        unknown = here("invocations", "get", "never-sent")
        assert unknown.returncode == 4 and "never-sent" in unknown.stderr and not unknown.stdout
        assert "--wait SECONDS" in unknown.stderr and "wait_s" not in unknown.stderr, unknown.stderr

        program = (
            "import asyncio\nfrom styx_client import StyxClient\n"
            "async def main():\n async with await StyxClient.connect() as c:\n"
            "  print(await c.call('account', 'alice', 'balance'))\n"
            "asyncio.run(main())"
        )
        connected = subprocess.run(
            [sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert connected.returncode == 0 and connected.stdout.strip() == "70", connected.stderr  # SDK too

        listed = here("env")
        assert listed.returncode == 0 and _exports(listed.stdout) == {
            **exports,
            "STYX_CLUSTER_SECRET": secret,
        }
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        lost = subprocess.run([*STYX, "status"], cwd=elsewhere, env=env, capture_output=True, text=True)
        assert lost.returncode == 2 and "run 'styx up'" in lost.stderr
        found = subprocess.run(
            [*STYX, "call", "account", "alice", "balance"],
            cwd=elsewhere,
            env={**env, **_exports(listed.stdout)},
            capture_output=True,
            text=True,
        )
        assert found.returncode == 0 and json.loads(found.stdout)["result"] == 70, found.stderr
        direct = subprocess.run(
            [
                *STYX,
                "call",
                "--kafka",
                exports["STYX_KAFKA_BOOTSTRAP"],
                "--app",
                BANK,
                "account",
                "alice",
                "balance",
            ],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
        )
        assert direct.returncode == 0 and json.loads(direct.stdout)["result"] == 70, direct.stderr
    finally:
        taken.close()
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)
    assert up.returncode == 0 and not (tmp_path / ".styx" / "cluster.json").exists()


# ---- without services --------------------------------------------------------------------------------


def test_version_is_the_package_version() -> None:
    out = styx("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"styx {version('styx-py')}"


def test_a_taken_port_falls_back_to_a_free_one() -> None:
    taken = _listening_socket()
    with taken:
        port = taken.getsockname()[1]
        other, fell_back = preferred_port(port)
        assert fell_back and other != port and can_bind(other)
    assert preferred_port(0)[1] is False


@pytest.mark.parametrize(
    ("token", "rule_broken"),
    [("hunter2", "this one has 7"), ("correct horse battery", "whitespace"), ("pässwörd-long", "other")],
)
def test_a_bad_gateway_token_names_the_rule_not_the_token(
    tmp_path: Path, token: str, rule_broken: str
) -> None:
    for how in ("env", "file"):
        (tmp_path / "token").write_text(token)
        args = ["gateway", "--coordinator", "127.0.0.1:1", "--port", "0"]
        out = subprocess.run(
            [*STYX, *args, *(["--token-file", str(tmp_path / "token")] if how == "file" else [])],
            env={**os.environ, "STYX_GATEWAY_TOKEN": token} if how == "env" else os.environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 2, out.stderr
        assert "at least 8 characters from A-Z a-z 0-9" in out.stderr and rule_broken in out.stderr
        assert token not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_call_through_kafka_needs_the_graph() -> None:
    out = styx("call", "--kafka", "127.0.0.1:1", "account", "alice", "balance")
    assert out.returncode == 2 and "--kafka needs --app" in out.stderr


def test_invocations_get_without_a_gateway_is_a_readable_error(tmp_path: Path) -> None:
    out = styx("invocations", "get", "x", "--gateway", "http://127.0.0.1:1", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("styx: error: cannot reach the gateway")


def test_the_audit_gets_the_s3_keys_from_the_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `styx audit` after `styx up` failed on (AccessDenied): the S3 keys now reach its config."""
    from styx_py.audit.options import config_from

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("STYX_")})
    settings = {
        "STYX_COORDINATOR": "127.0.0.1:6000",
        "STYX_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
        "STYX_S3_ENDPOINT": "127.0.0.1:8333",
        "STYX_S3_ACCESS_KEY": "styx-abcd",
        "STYX_S3_SECRET_KEY": "s3-secret-key",
        "STYX_CLUSTER_SECRET": "x" * 32,
    }
    ClusterFile(settings, pid=os.getpid()).write()
    args = build_parser().parse_args(["audit", "--out", str(tmp_path / "out")])
    use_cluster_file(args)
    config = config_from(args)
    assert config.kafka == "127.0.0.1:9092" and config.s3 is not None
    assert (config.s3.endpoint, config.s3.access_key, config.s3.secret_key) == (
        "127.0.0.1:8333",
        "styx-abcd",
        "s3-secret-key",
    )
    other = build_parser().parse_args(["audit", "--kafka", "10.0.0.1:9092", "--out", "o"])
    monkeypatch.setattr(os, "environ", {})
    use_cluster_file(other)  # another cluster's log: nothing of the local cluster's file applies
    assert os.environ == {}


def test_a_stale_cluster_file_is_named(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / ".styx").mkdir()
    ClusterFile({"STYX_COORDINATOR": "127.0.0.1:1"}, pid=int(dead.stdout)).write(
        tmp_path / ".styx" / "cluster.json"
    )
    out = styx("status", cwd=tmp_path)
    assert out.returncode == 2 and "no longer running" in out.stderr, out.stderr


def test_status_prints_tables() -> None:
    body = {
        "graph": "styx_benchmarks.bank:app",
        "epoch": 1234,
        "state": "running",
        "generation": 2,
        "epochs_per_s": 812.5,
        "txn_per_s": 15_000.0,
        "abort_rate": 0.0125,
        "totals": {"committed": 120_000, "aborted": 1500, "rejected": 3, "rescheduled": 1, "fallback": 40},
        "failed_workers": [],
        "last_snapshot": {"epoch": 1200, "objects": 8, "bytes": 12_345},
        "compactions": 3,
        "recoveries": 1,
        "stalled_epochs": 0,
        "last_recovery": {
            "generation": 2,
            "snapshot_epoch": 100,
            "detect_s": 1.0,
            "restore_s": 0.2,
            "replay_epochs": 5,
            "replay_s": 0.3,
        },
        "workers": [
            {
                "node_id": "w1",
                "sid": 1,
                "address": "127.0.0.1:4001",
                "partitions": [0, 2],
                "last_heartbeat_s_ago": 0.1,
            },
            {
                "node_id": "w2",
                "sid": 2,
                "address": "127.0.0.1:4002",
                "partitions": [1, 3],
                "txn_per_s": 1234.56,
                "last_heartbeat_s_ago": 0.0,
            },
        ],
        "operators": [{"name": "account", "partitions": 4, "functions": ["balance", "deposit"]}],
        "warnings": [],
    }
    text = format_status(body)
    assert "{" not in text and "'" not in text
    assert "812.5 epochs/s, 15,000.0 txn/s, abort rate 1.25% (last 10 s)" in text
    assert "snapshot      epoch 1200, 8 objects, 12,345 bytes, 3 compactions\n" in text
    assert "replay 5 epochs 0.3 s\n" in text, "no recovery under way"
    failing = format_status({**body, "failed_compactions": 2, "recovery_attempts": 4})
    assert "snapshot      epoch 1200, 8 objects, 12,345 bytes, 3 compactions (2 failed)\n" in failing
    assert "replay 5 epochs 0.3 s; under way: attempt 4\n" in failing
    moved = {
        **body,
        "compactions": 1,
        "last_snapshot": {"epoch": 1200, "objects": 1, "bytes": 12_345},
        "shape_changes": [{"change": "w3 joined", "moved": 1, "barrier": True}],
        "last_move": {"generation": 3, "after_epoch": 812, "move_s": 0.05},
        "desired_workers": 3,
    }
    text_moved = format_status(moved)
    assert "epoch 1200, 1 object, 12,345 bytes, 1 compaction\n" in text_moved, text_moved
    shape = "shape         1 change; last: w3 joined, 1 partition moved after epoch 812 in 0.05 s"
    assert f"{shape}; desired workers 3\n" in text_moved, text_moved
    header = "committed  aborted  rejected  fallback  rescheduled"
    assert f"{header}\n  120,000    1,500         3        40            1" in text
    lost = format_status({**body, "state": "log-lost", "degraded": "the Kafka broker lost the log"})
    assert "state         log-lost, generation 2" in lost
    assert "LOG LOST      the Kafka broker lost the log\n" in lost
    assert "DEGRADED      x\n" in format_status({**body, "state": "degraded", "degraded": "x"})
    assert re.search(r"^w2 +2 +127\.0\.0\.1:4002 +1,3 +1,234\.6 +0\.0 s ago$", text, re.M), text
    assert re.search(r"^w1 +1 +127\.0\.0\.1:4001 +0,2 +0\.0 +0\.1 s ago$", text, re.M), text
    assert re.search(r"^account +4 +balance, deposit$", text, re.M), text
