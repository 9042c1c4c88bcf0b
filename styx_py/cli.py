"""The ``styx`` command: run a local cluster, deploy apps, call functions, inspect status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from styx_py.core.addresses import bootstrap, bootstrap_option, host_port_option
from styx_py.core.config import Config, load_config
from styx_py.core.errors import ConfigError, StyxError
from styx_py.core.words import counted
from styx_py.extras import add_parser, require
from styx_py.gateway_cli import EXIT_PENDING, add_gateway_commands
from styx_py.gateway_cli import gateway_token as _gateway_token
from styx_py.io.runtime import run, setup_logging
from styx_py.state_cli import add_state_commands

if TYPE_CHECKING:
    from styx_client import StyxClient
    from styx_py.stack.local import LocalStack

DEMO_APP = "styx_benchmarks.bank:app"


_LOOKS_LIKE_JSON = re.compile(r"[-+\d.\[{\"]|(true|false|null)\b")


def _parse_arg(text: str) -> Any:
    """Arguments on the command line are JSON (``10``, ``"bob"``, ``[1, 2]``, ``{"a": 1}``); a bare word
    (``bob``) is a string. Anything that starts like a JSON value but is not one (``1O``, ``[1,``) is an
    error naming it, never a string it was not meant to be."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if _LOOKS_LIKE_JSON.match(text.strip()):
            raise StyxError(
                f"argument {text!r} is not valid JSON ({exc.msg}); quote a string that looks like a "
                f"number or a list: '\"{text}\"'"
            ) from None
        return text


def cmd_up(args: argparse.Namespace) -> int:
    require("styx up", "local")
    from styx_py.stack.local import STATE_FILE, LocalStack, StackPorts

    _check_no_cluster_here(STATE_FILE)
    # aiokafka logs every refused connection while the broker starts; readiness is checked anyway.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="styx-"))
    state_functions = list(args.state_function)  # overrides; by default the deployed graph names them
    gateway_args: list[str] = []
    for item in state_functions:
        gateway_args += ["--state-function", item]
    ports = StackPorts(
        args.coordinator_port, args.gateway_port, args.kafka_port, args.s3_port, args.metrics_port
    )
    stack = LocalStack(
        data_dir,
        workers=args.workers,
        durable=args.durable,
        gateway=not args.no_gateway,
        gateway_args=gateway_args,
        ports=ports,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print(
        f"starting styx-py: SeaweedFS, Tansu ({'S3' if args.durable else 'memory'} storage), "
        f"coordinator, {counted(args.workers, 'worker')}{'' if args.no_gateway else ', HTTP gateway'} …",
        flush=True,
    )
    try:
        stack.start()
        _announce(stack, STATE_FILE)
        if args.demo:
            from styx_benchmarks.demo import run_demo

            stack.deploy(DEMO_APP)
            print(f"deployed {DEMO_APP}", flush=True)
            ok = asyncio.run(run_demo(stack.coordinator, seconds=args.demo_seconds, rate=args.demo_rate))
            print("demo finished: " + ("OK" if ok else "FAILED"), flush=True)
            if not args.stay:
                return 0 if ok else 1
        elif args.app:
            stack.deploy(args.app)
            print(f"deployed {args.app}", flush=True)
        print("cluster is up; Ctrl-C stops it", flush=True)
        while not stopping.wait(0.5):
            for line in stack.supervise():
                print(line, flush=True)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping …", flush=True)
        stack.stop()
        STATE_FILE.unlink(missing_ok=True)
        if not args.data_dir and not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
        print("stopped", flush=True)


def _check_no_cluster_here(state_file: Path) -> None:
    """One ``styx up`` per directory: a second would overwrite the first's cluster file."""
    from styx_py.io.clusterfile import read_cluster_file

    try:
        running = read_cluster_file(state_file)
    except StyxError:
        return  # stale (its styx up is gone) or unreadable: this run replaces it
    if running is not None:
        raise StyxError(
            f"a 'styx up' (pid {running.pid}) already runs from this directory ({running.coordinator}); "
            f"stop it or run this one in another directory"
        )


def _announce(stack: LocalStack, state_file: Path) -> None:
    """Print the endpoints and the client settings of a started stack; save them to ``state_file``."""
    from styx_py.io.clusterfile import ClusterFile, export_lines

    for note in [*stack.reaped, *stack.port_notes]:
        print(f"note: {note}", flush=True)
    endpoints = stack.endpoints()
    if stack.gateway_url:
        endpoints["http docs"] = f"{stack.gateway_url}/docs"
        endpoints["console"] = f"{stack.gateway_url}/console"
    for name, address in endpoints.items():
        print(f"  {name:<20} {address}", flush=True)
    print(f"  {'logs':<20} {stack.log_dir}", flush=True)
    env = stack.client_env()
    ClusterFile(env, endpoints, str(stack.log_dir), os.getpid()).write(state_file)
    print(
        f"client settings (saved in {state_file}, which styx commands run in this directory read; "
        f"elsewhere: eval these lines):",
        flush=True,
    )
    print("\n".join(export_lines(env, secrets=False, path=state_file)), flush=True)


def _kafka(args: argparse.Namespace, config: Config) -> str:
    kafka = args.kafka or config.kafka_bootstrap
    if not kafka:
        raise ConfigError("no Kafka bootstrap address: pass --kafka HOST:PORT or set STYX_KAFKA_BOOTSTRAP")
    bootstrap(str(kafka), "the Kafka bootstrap")  # from the environment: checked as --kafka is
    return str(kafka)


def cmd_coordinator(args: argparse.Namespace) -> int:
    require("styx coordinator", "server")
    from styx_coordinator.main import serve_coordinator

    config = load_config()  # fails here, naming the setting, on a bad value
    setup_logging("coordinator", config.log_level)
    kafka = _kafka(args, config)
    run(serve_coordinator(config, kafka, args.workers, args.host, args.port, args.deploy), server_gc=True)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    require("styx worker", "server")
    from styx_worker.main import serve_worker

    config = load_config()
    setup_logging(args.id, config.log_level)
    coordinator = args.coordinator or config.coordinator
    if not coordinator:
        raise ConfigError("no coordinator address: pass --coordinator HOST:PORT or set STYX_COORDINATOR")
    kafka = _kafka(args, config)
    run(
        serve_worker(args.id, coordinator, kafka, config, args.host, args.port, args.advertise_host),
        server_gc=True,
    )
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from styx_py.core.wire import DeployRequest
    from styx_py.stack.local import admin, coordinator_address

    body = asyncio.run(admin(coordinator_address(args.coordinator), DeployRequest(args.import_path)))
    versions = body.get("versions") or []
    running = (
        f" (version {versions[-1]['version']}, from epoch {versions[-1]['first_epoch']})" if versions else ""
    )
    print(f"deployed {body['graph']}{running} on {counted(len(body['workers']), 'worker')}")
    for op in body["operators"]:
        functions = ", ".join(op["functions"])
        print(f"  {op['name']}: {counted(op['partitions'], 'partition')}, functions {functions}")
    for warning in body.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from styx_py.core.wire import DrainRequest, ScaleRequest, StatusRequest
    from styx_py.stack.local import admin, coordinator_address

    address = coordinator_address(args.coordinator)
    msg = DrainRequest(args.drain) if args.drain else ScaleRequest(args.workers)
    body = asyncio.run(admin(address, msg))
    if body.get("draining"):
        one = len(body["draining"]) == 1
        what = "its partitions move, then it stops" if one else "their partitions move, then they stop"
        print(f"draining {', '.join(body['draining'])}: {what}", flush=True)
    if body.get("waiting_for"):
        print(
            f"waiting for {counted(body['waiting_for'], 'more worker')} to register (start them: 'styx up' "
            "does, a Kubernetes StatefulSet does when its replicas are raised)",
            flush=True,
        )

    def done(status: dict[str, Any]) -> bool:
        workers = [w["node_id"] for w in status["workers"]]
        shaped = args.drain not in workers if args.drain else len(workers) == args.workers
        return shaped and status["state"] == "running"

    if not args.no_wait:
        deadline = time.monotonic() + args.timeout
        while not done(body):
            if body.get("degraded"):
                raise StyxError(f"the cluster is degraded: {body['degraded']}")
            if time.monotonic() > deadline:
                have = [w["node_id"] for w in body["workers"]]
                print(
                    f"styx: not done after {args.timeout:g} s: {counted(len(have), 'worker')} "
                    f"({', '.join(have)}), {body['state']}; the change goes on ('styx status' follows it)",
                    file=sys.stderr,
                )
                return EXIT_PENDING
            time.sleep(SCALE_POLL_S)
            body = asyncio.run(admin(address, StatusRequest()))
    workers = [w["node_id"] for w in body["workers"]]
    line = f"workers now: {', '.join(workers)} ({body['state']}, generation {body['generation']})"
    changes, move = body.get("shape_changes") or [], body.get("last_move")
    if not args.no_wait and changes and changes[-1].get("moved") is not None:
        line += f"; {counted(changes[-1]['moved'], 'partition')} moved"
        if move and changes[-1].get("barrier"):
            line += f" after epoch {move['after_epoch']} in {move['move_s']} s"
    print(line)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from styx_py.core.wire import StatusRequest
    from styx_py.stack.local import admin, coordinator_address

    body = asyncio.run(admin(coordinator_address(args.coordinator), StatusRequest()))
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(format_status(body))
    return 0


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; a column of numbers (digits, commas and points only) is
    right-aligned, its header too."""
    columns = list(zip(headers, *rows, strict=True))
    widths = [max(len(c) for c in col) for col in columns]
    numeric = [bool(rows) and all(re.fullmatch(r"[\d,.]+", c) for c in col[1:]) for col in columns]

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True)]
        return "  ".join(out).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _version_line(body: dict[str, Any]) -> str:
    """``, version 2 from epoch 130 (before: 1 tests.apps.v1:app from 0)``: the running version and its
    history (code updates take effect at an epoch boundary)."""
    versions = body.get("versions") or []
    if not versions:
        return ""
    last = versions[-1]
    line = f", version {last['version']} from epoch {last['first_epoch']}"
    if len(versions) > 1:
        history = "; ".join(f"{v['version']} {v['graph']} from {v['first_epoch']}" for v in versions[:-1])
        line += f" (before: {history})"
    return line


def format_status(body: dict[str, Any]) -> str:
    """``styx status`` for a person: the cluster line, rates, totals, snapshot, recoveries, tables."""
    from styx_coordinator.status import STATUS_RATE_WINDOW_S

    lines = [
        f"graph         {body['graph'] or '(nothing deployed)'}{_version_line(body)}",
        f"state         {body.get('state', '?')}{', overloaded' if body.get('overloaded') else ''}, "
        f"generation {body.get('generation', '?')}, epoch {body['epoch']}",
        f"rates         {body['epochs_per_s']:,} epochs/s, {body['txn_per_s']:,} txn/s, "
        f"abort rate {body['abort_rate']:.2%} (last {STATUS_RATE_WINDOW_S} s)",
    ]
    if body.get("overloaded"):
        lines.append(
            f"OVERLOADED    refusing {body.get('refused_per_s', 0):,} requests/s (admission control; "
            f"{body['totals'].get('refused', 0):,} refused since the start)"
        )
    if body.get("degraded"):
        label = "LOG LOST" if body.get("state") == "log-lost" else "DEGRADED"
        lines.append(f"{label:<14}{body['degraded']}")
    if body["failed_workers"]:
        lines.append(f"FAILED        {', '.join(body['failed_workers'])}")
    snap = body.get("last_snapshot")
    if snap:
        objects = counted(snap["objects"], "object")
        line = f"snapshot      epoch {snap['epoch']}, {objects}, {snap['bytes']:,} bytes"
        line += f", {counted(body['compactions'], 'compaction')}" if "compactions" in body else ""
        line += f" ({body['failed_compactions']} failed)" if body.get("failed_compactions") else ""
        lines.append(line)
    else:
        lines.append("snapshot      none yet")
    rec = body.get("last_recovery")
    recoveries = f"recoveries    {body.get('recoveries', 0)}, stalled epochs {body.get('stalled_epochs', 0)}"
    if rec:
        replay = "running" if rec.get("replay_s") is None else f"{rec['replay_s']} s"
        recoveries += (
            f"; last: generation {rec['generation']} from snapshot {rec['snapshot_epoch']}, "
            f"detect {rec['detect_s']} s, restore {rec['restore_s']} s, "
            f"replay {counted(rec['replay_epochs'], 'epoch')} {replay}"
        )
    if body.get("recovery_attempts"):
        recoveries += f"; under way: attempt {body['recovery_attempts']}"
    lines.append(recoveries)
    changes = body.get("shape_changes") or []
    if changes or body.get("desired_workers") is not None:
        last = changes[-1] if changes else None
        shape = f"shape         {counted(len(changes), 'change')}"
        shape += f"; last: {last['change']}" if last else ""
        if last and last.get("moved") is not None:
            shape += f", {counted(last['moved'], 'partition')} moved"
        if (move := body.get("last_move")) and last and last.get("barrier"):
            shape += f" after epoch {move['after_epoch']} in {move['move_s']} s"
        if body.get("desired_workers") is not None:
            shape += f"; desired workers {body['desired_workers']}"
        lines.append(shape)
    workers = body["workers"]
    if any(o["name"] == "styx.outbox" for o in body.get("operators") or []):
        calls, running, timers = (
            sum(w.get(f, 0) for w in workers)
            for f in ("external_calls_pending", "external_calls_running", "timers_pending")
        )
        lines.append(
            f"effects       {calls:,} external calls pending ({running:,} running), {timers:,} timers pending"
        )
    totals = body["totals"]
    lines += ["", "transactions since start (rejected: bad requests, not in the abort rate)"]
    names = ["committed", "aborted", "rejected", "fallback", "rescheduled"]
    lines += _table(names, [[f"{totals.get(n, 0):,}" for n in names]])
    lines.append("")
    lines += _table(
        ["worker", "sid", "address", "partitions", "txn/s", "heartbeat"],
        [
            [
                w["node_id"],
                str(w["sid"]),
                w["address"],
                ",".join(map(str, w["partitions"])) or "-",
                f"{w.get('txn_per_s', 0.0):,.1f}",  # measured load (a coordinator before it: none)
                f"{w['last_heartbeat_s_ago']:.1f} s ago",
            ]
            for w in body["workers"]
        ],
    )
    if body.get("operators"):
        lines.append("")
        lines += _table(
            ["operator", "partitions", "functions"],
            [[o["name"], str(o["partitions"]), ", ".join(o["functions"])] for o in body["operators"]],
        )
    lines += [f"warning: {w}" for w in body.get("warnings") or []]
    return "\n".join(lines)


def _state_functions(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        operator, sep, function = item.partition("=")
        if not sep or not operator or not function:
            raise StyxError(f"--state-function expects OPERATOR=FUNCTION, got {item!r}")
        out[operator] = function
    return out


def cmd_gateway(args: argparse.Namespace) -> int:
    require("styx gateway", "server")
    from styx_client.gateway import GatewayConfig, GatewayLimits, GatewayTiming, serve_gateway
    from styx_py.stack.local import cluster_secret, coordinator_address

    setup_logging("gateway")
    coordinator = coordinator_address(args.coordinator)
    config = GatewayConfig(
        coordinator,
        cluster_secret=cluster_secret(coordinator),
        host=args.host,
        port=args.port,
        token=_gateway_token(args),
        state_functions=_state_functions(args.state_function),
        limits=GatewayLimits(
            max_pending=args.max_pending,
            max_body_bytes=args.max_body_bytes,
            max_recent_invocations=args.recent_invocations,
        ),
        timing=GatewayTiming(reply_timeout_s=args.reply_timeout),
    )

    def announce(url: str) -> None:
        print(
            f"gateway listening on {url} (docs {url}/docs, console {url}/console); "
            f"coordinator {config.coordinator}",
            flush=True,
        )

    run(serve_gateway(config, announce=announce))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from styx_client import StyxClient
    from styx_py.stack.local import cluster_secret, coordinator_address

    key, values = _parse_arg(args.key), [_parse_arg(a) for a in args.args]  # before connecting

    async def call() -> int:
        if args.kafka:
            client = _client_without_coordinator(args.kafka, args.app, args.timeout)
            await client.start()
        else:
            coordinator = coordinator_address(args.coordinator)
            client = await StyxClient.connect(coordinator, cluster_secret=cluster_secret(coordinator))
        try:
            reply = await client.submit(args.operator, key, args.function, *values, timeout_s=args.timeout)
        finally:
            await client.close()
        out = {"request_id": reply.request_id, "status": reply.status, "tid": reply.tid, "epoch": reply.epoch}
        if reply.status == "committed":
            out["result"] = reply.value
        else:
            out["error"] = reply.error
            out["error_type"] = reply.error_type
        print(json.dumps(out))
        return 0 if reply.status == "committed" else 3

    return asyncio.run(call())


def _client_without_coordinator(kafka: str, app: str | None, timeout_s: float) -> StyxClient:
    """A client that talks to Kafka only. It must know each operator's partition count to produce to
    the partition that owns the key, and the coordinator is what tells it; without one, the graph
    (imported here, as the workers do) tells it. Topics: ``STYX_INGRESS_TOPIC``/``STYX_EGRESS_TOPIC``."""
    from styx_client import StyxClient
    from styx_py.core.graph import load_graph

    if not app:
        raise StyxError(
            "--kafka needs --app package.module:graph: without the coordinator, the operators and their "
            "partition counts come from the deployed graph"
        )
    config = load_config()
    specs = load_graph(app).specs()
    return StyxClient(
        kafka,
        {s.name: s.partitions for s in specs},
        functions={s.name: s.functions for s in specs},
        ingress_topic=config.ingress_topic,
        egress_topic=config.egress_topic,
        timeout_s=timeout_s,
    )


SCALE_POLL_S = 0.2  # styx scale: how often it asks for the status while the change runs


def cmd_env(args: argparse.Namespace) -> int:
    """Print the client settings of the cluster ``styx up`` runs from this directory as export lines."""
    from styx_py.io.clusterfile import STATE_FILE, export_lines, read_cluster_file

    state = read_cluster_file()
    if state is None:
        raise StyxError(f"no {STATE_FILE} here: run 'styx up' in this directory first")
    print("\n".join(export_lines(state.env, secrets=True)))
    return 0


CLIENT_COMMANDS = frozenset(
    {"deploy", "status", "call", "invocations", "console", "gateway", "audit", "state", "sql"}
)


def use_cluster_file(args: argparse.Namespace) -> None:
    """Fill the ``STYX_*`` settings a client command has not got from ``.styx/cluster.json`` (left by
    ``styx up`` in this directory), unless the command is pointed at another cluster."""
    from styx_py.io.clusterfile import read_cluster_file

    explicit = getattr(args, "coordinator", None) or os.environ.get("STYX_COORDINATOR")
    try:
        state = read_cluster_file()
    except StyxError:
        if explicit:
            return  # a stale file does not matter to a command pointed at a cluster
        raise
    kafka = getattr(args, "kafka", None)
    if state is None or (explicit and explicit != state.coordinator):
        return
    if kafka and kafka != state.env.get("STYX_KAFKA_BOOTSTRAP"):
        return
    for name, value in state.env.items():
        os.environ.setdefault(name, value)


def cmd_bench(args: argparse.Namespace) -> int:
    from styx_benchmarks.bench import cmd_bench as run_bench

    # `kill -USR1 PID` prints every thread's stack: what a long or stuck run is doing (not when stderr
    # is no file, as under pytest's capture).
    with contextlib.suppress(io.UnsupportedOperation, ValueError, AttributeError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    return run_bench(args)


def _simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", metavar="APP", help="import path of your graph, module:graph")
    p.add_argument(
        "--workload",
        required=True,
        metavar="MODULE:FUNCTION",
        help="a function of a random.Random that yields calls (operator, key, function, args)",
    )
    p.add_argument(
        "--invariant",
        metavar="MODULE:FUNCTION",
        help="a function of the final state {(operator, key): value} that yields each problem it finds",
    )
    p.add_argument(
        "--services",
        metavar="MODULE:FUNCTION",
        help="a function of a random.Random that returns doubles of the graph's external services by name "
        "(the invariant then gets them too)",
    )
    p.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    p.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--seed", type=int, help="run this one seed only (to replay a failure)")
    p.add_argument("--requests", type=int, default=200, help="calls per seed (default 200)")
    p.add_argument("--workers", type=int, default=3, help="workers at the start (default 3)")
    p.add_argument("--update", metavar="APP", help="also deploy this graph (a code update) during each run")
    p.add_argument("--no-faults", action="store_true", help="no crashes, lost messages or reshapes")


def cmd_simulate(args: argparse.Namespace) -> int:
    from styx_py.testing.simulate import NO_FAULTS, Faults, SeedResult, resolve, simulate

    workload = resolve(args.workload, "--workload")
    invariant = resolve(args.invariant, "--invariant") if args.invariant else None
    services = resolve(args.services, "--services") if args.services else None
    faults = NO_FAULTS if args.no_faults else Faults(update=args.update)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    print(f"simulating {args.app}: {counted(len(seeds), 'seed')}, {faults.describe()}", flush=True)
    done = 0

    def progress(result: SeedResult) -> None:
        nonlocal done
        done += 1
        if not result.ok:
            print(f"  seed {result.seed}: FAILED", flush=True)
        elif done % 25 == 0:
            print(f"  {counted(done, 'seed')} run", flush=True)

    report = simulate(
        args.app,
        workload,
        seeds=seeds,
        faults=faults,
        invariant=invariant,
        services=services,
        requests=args.requests,
        workers=args.workers,
        progress=progress,
    )
    replay = f"styx simulate {args.app} --workload {args.workload}"
    replay += f" --invariant {args.invariant}" if args.invariant else ""
    replay += f" --services {args.services}" if args.services else ""
    replay += f" --update {args.update}" if args.update else ""
    replay += " --no-faults" if args.no_faults else ""
    replay += f" --requests {args.requests} --workers {args.workers} --seed {{seed}}"
    print(report.describe(replay), flush=True)
    return 0 if report.ok else 1


def cmd_audit(args: argparse.Namespace) -> int:
    try:
        from styx_py.audit.job import run_from_args
    except ModuleNotFoundError as exc:
        raise StyxError(
            f"styx audit needs the 'spark' extra (pip install -e '.[spark]'): no {exc.name}"
        ) from exc
    return run_from_args(args)


def _audit_arguments(p: argparse.ArgumentParser) -> None:
    from styx_py.audit.options import add_arguments  # light: PySpark is imported only when it runs

    add_arguments(p)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("styx-py")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """The ``styx`` parser and its subcommands': a bad argument (an address that is not HOST:PORT, a
    missing value) is one line on stderr that points at ``--help``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from styx_py.stack.net import DEFAULT_PORTS  # light: --help stays fast

    p: argparse.ArgumentParser = _Parser(
        prog="styx", description="styx-py: deterministic transactional stateful functions"
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up", help="run a whole local cluster (S3, Kafka-protocol broker, coordinator, workers)"
    )
    up.add_argument("--workers", type=int, default=2, help="number of worker processes (default 2)")
    up.add_argument("--durable", action="store_true", help="broker keeps its log in S3 (survives restarts)")
    up.add_argument("--demo", action="store_true", help="deploy the bank demo and run a short workload")
    up.add_argument("--demo-seconds", type=float, default=5.0, help="length of the demo workload")
    up.add_argument("--demo-rate", type=float, default=500.0, help="transfers per second in the demo")
    up.add_argument("--stay", action="store_true", help="keep the cluster running after the demo")
    up.add_argument("--app", help="deploy this graph (package.module:graph) once up")
    up.add_argument("--data-dir", help="where services keep data and logs (default: a temp dir)")
    up.add_argument("--keep", action="store_true", help="keep the temp data dir after stopping")
    up.add_argument("--no-gateway", action="store_true", help="do not start the HTTP gateway")
    ports = DEFAULT_PORTS
    for name, default, what in (
        ("coordinator", ports.coordinator, "coordinator port"),
        ("gateway", ports.gateway, "HTTP gateway port"),
        ("kafka", ports.kafka, "Kafka-protocol broker port"),
        ("s3", ports.s3, "S3 port (also needs this + 10000, SeaweedFS's gRPC port)"),
        ("metrics", ports.metrics, "coordinator's /metrics port; worker wN gets this + N"),
    ):
        up.add_argument(
            f"--{name}-port",
            type=int,
            default=default,
            help=f"{what} (default {default}; a free one when taken, which is printed; 0: a free one)",
        )
    up.add_argument(
        "--state-function",
        action="append",
        default=[],
        metavar="OPERATOR=FUNCTION",
        help="read-only function behind GET /v1/state/OPERATOR/KEY (repeatable; demo: account=balance)",
    )
    up.set_defaults(fn=cmd_up)

    co = sub.add_parser("coordinator", help="run the coordinator process")
    co.add_argument(
        "--kafka", type=bootstrap_option, help="Kafka bootstrap HOST:PORT (default: $STYX_KAFKA_BOOTSTRAP)"
    )
    co.add_argument("--workers", type=int, default=1, help="workers to wait for before deploying")
    co.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    co.add_argument("--port", type=int, default=6000, help="port workers and clients connect to")
    co.add_argument("--deploy", help="deploy this graph at start")
    co.set_defaults(fn=cmd_coordinator)

    wk = sub.add_parser("worker", help="run a worker process")
    wk.add_argument("--id", required=True, help="worker id, unique in the cluster")
    wk.add_argument(
        "--coordinator", type=host_port_option, help="coordinator HOST:PORT (default: $STYX_COORDINATOR)"
    )
    wk.add_argument(
        "--kafka", type=bootstrap_option, help="Kafka bootstrap HOST:PORT (default: $STYX_KAFKA_BOOTSTRAP)"
    )
    wk.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    wk.add_argument("--port", type=int, default=0, help="port peers connect to (0: a free one)")
    wk.add_argument(
        "--advertise-host",
        help="name or address the coordinator and peers reach this worker at (default: --host)",
    )
    wk.set_defaults(fn=cmd_worker)

    gw = sub.add_parser(
        "gateway",
        help="run the HTTP gateway (POST /v1/invocations; docs at /docs)",
        description="Serve the HTTP API of a running cluster. Binding to a non-loopback address "
        "requires a bearer token ($STYX_GATEWAY_TOKEN or --token-file).",
    )
    gw.add_argument(
        "--coordinator",
        type=host_port_option,
        help="HOST:PORT (default: $STYX_COORDINATOR or the cluster from 'styx up')",
    )
    gw.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gw.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: a free one)")
    gw.add_argument("--token-file", help="file holding the bearer token (else $STYX_GATEWAY_TOKEN)")
    gw.add_argument("--max-pending", type=int, default=1000, help="invocations in flight before 429")
    gw.add_argument("--max-body-bytes", type=int, default=1024 * 1024, help="largest request body (413)")
    gw.add_argument("--reply-timeout", type=float, default=30.0, help="default reply wait in seconds (504)")
    gw.add_argument(
        "--recent-invocations",
        type=int,
        default=1000,
        help="invocations kept for GET /v1/invocations and the console (default 1000; also at most 16 MiB)",
    )
    gw.add_argument(
        "--state-function",
        action="append",
        default=[],
        metavar="OPERATOR=FUNCTION",
        help="read-only, argument-less function behind GET /v1/state/OPERATOR/KEY (repeatable)",
    )
    gw.set_defaults(fn=cmd_gateway)

    bench = add_parser(
        sub,
        "bench",
        "bench",
        help="run a benchmark workload open-loop (ycsbt, tpcc, deathstar-*); results and plots",
        description="Open-loop benchmark: requests leave on the clock, latency is measured from each "
        "request's scheduled send time. Starts a local cluster unless --coordinator is given.",
    )
    if bench is not None:  # else a stand-in that names the extra
        from styx_benchmarks.bench import add_arguments as bench_arguments

        bench_arguments(bench)
        bench.set_defaults(fn=cmd_bench)

    au = add_parser(
        sub,
        "audit",
        "spark",
        help="audit a run on Spark: exactly-once, ordering, invariants, latency; report + Parquet",
        description="Read the ingress, egress and sequencer-log topics (and a snapshot from S3) with "
        "PySpark and check exactly-once replies, the Mencius tid order, the workload's invariants and "
        "the serial replay; write OUT/report.html (self-contained), OUT/report.md, OUT/plots/*.png and "
        "OUT/tables/*.parquet. Exit code 0: every check passed (skipped checks are listed); 1: a check "
        "failed; 2: the audit could not run (Kafka/S3 unreachable, refused credentials, bad arguments). "
        "Needs the 'spark' extra.",
    )
    if au is not None:
        _audit_arguments(au)
        au.set_defaults(fn=cmd_audit)

    sq = add_parser(
        sub,
        "sql",
        "spark",
        help="Spark SQL over each operator's state (newest snapshot or --as-of-epoch) and the logs",
        description="Run a Spark SQL query over one table per operator (its state at the newest "
        "snapshot, or as of --as-of-epoch E: the snapshot chain in S3 and the changelog topic) and over "
        "the logs: requests, replies, epochs, aborts. Prints a table, or JSON with --json; progress on "
        "stderr. Exit code 2 with one line when the query cannot be answered. Needs the 'spark' extra.",
    )
    if sq is not None:
        from styx_py.sql_cli import add_sql_arguments, cmd_sql

        add_sql_arguments(sq)
        sq.set_defaults(fn=cmd_sql)

    sim = add_parser(
        sub,
        "simulate",
        "sim",
        help="run your app's graph in the simulation: seeded crashes and reshapes, a serial-execution check",
        description="Run the graph at APP (module:graph) on a whole simulated cluster on virtual time, "
        "once per seed: the workload's calls go through real SDK clients while workers and the "
        "coordinator crash, messages are lost and repeated and workers join and leave; every reply and "
        "the final state must equal a serial execution, and the invariant must hold. A failing seed is "
        "printed with what failed and how to run it alone. Exit code 0: every seed passed; 1: one failed.",
    )
    if sim is not None:
        _simulate_arguments(sim)
        sim.set_defaults(fn=cmd_simulate)

    for name, fn, helptext in (
        ("deploy", cmd_deploy, "deploy a graph by import path"),
        ("status", cmd_status, "show workers, partitions, epoch rate, aborts"),
        ("call", cmd_call, "run one transaction and print its reply"),
        ("scale", cmd_scale, "change the number of workers (partitions move at an epoch barrier)"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument(
            "--coordinator",
            type=host_port_option,
            help="HOST:PORT (default: $STYX_COORDINATOR or the cluster from 'styx up')",
        )
        sp.set_defaults(fn=fn)
        if name == "deploy":
            sp.add_argument("import_path", help="package.module:graph")
        elif name == "status":
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        elif name == "scale":
            how = sp.add_mutually_exclusive_group(required=True)
            how.add_argument(
                "--workers",
                type=int,
                help="run on N workers: fewer drains the highest-named ones, more waits for them to register",
            )
            how.add_argument(
                "--drain", metavar="NODE", help="move every partition off worker NODE and stop it"
            )
            sp.add_argument(
                "--timeout",
                type=float,
                default=120.0,
                metavar="SECONDS",
                help="wait this long for the new shape to run (then exit 5; the change goes on)",
            )
            sp.add_argument("--no-wait", action="store_true", help="return once the change is asked for")
        else:
            sp.add_argument(
                "--kafka",
                type=bootstrap_option,
                help="call through Kafka HOST:PORT without the coordinator (needs --app; topics from "
                "$STYX_INGRESS_TOPIC/$STYX_EGRESS_TOPIC)",
            )
            sp.add_argument("--app", help="with --kafka: the deployed graph (package.module:graph)")
            sp.add_argument("operator")
            sp.add_argument("key", help="entity key (JSON number → int key, otherwise a string)")
            sp.add_argument("function")
            sp.add_argument("args", nargs="*", help="arguments, each JSON or a plain string")
            sp.add_argument("--timeout", type=float, default=30.0)

    env = sub.add_parser(
        "env",
        help="print the client settings of the cluster 'styx up' runs here: eval \"$(styx env)\"",
        description="Print export lines for the cluster that 'styx up' runs from this directory (read "
        "from .styx/cluster.json): endpoints, S3 keys and the cluster secret, for a shell in another "
        "directory or a program that reads STYX_* settings.",
    )
    env.set_defaults(fn=cmd_env)

    add_gateway_commands(sub)
    add_state_commands(sub, _parse_arg)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in CLIENT_COMMANDS:
            use_cluster_file(args)
        return int(args.fn(args))
    except StyxError as exc:
        print(f"styx: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
