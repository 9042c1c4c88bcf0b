"""The ``styx`` command: run a local cluster, deploy apps, call functions, inspect status."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from styx_py.core.config import Config, load_config
from styx_py.core.errors import ConfigError, StyxError
from styx_py.io.runtime import run, setup_logging

DEMO_APP = "styx_py.benchmarks.bank:app"
DEMO_STATE_FUNCTION = "account=balance"  # the demo's read-only function behind GET /v1/state


def _parse_arg(text: str) -> Any:
    """Arguments on the command line are JSON when they parse as JSON, plain strings otherwise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_up(args: argparse.Namespace) -> int:
    from styx_py.stack.local import STATE_FILE, LocalStack

    # aiokafka logs every refused connection while the broker starts; readiness is checked anyway.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="styx-"))
    state_functions = list(args.state_function)
    if (args.demo or args.app == DEMO_APP) and not state_functions:
        state_functions = [DEMO_STATE_FUNCTION]
    gateway_args: list[str] = []
    for item in state_functions:
        gateway_args += ["--state-function", item]
    stack = LocalStack(
        data_dir,
        workers=args.workers,
        durable=args.durable,
        gateway=not args.no_gateway,
        gateway_port=args.gateway_port,
        gateway_args=gateway_args,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print(
        f"starting styx-py: SeaweedFS, Tansu ({'S3' if args.durable else 'memory'} storage), "
        f"coordinator, {args.workers} workers{'' if args.no_gateway else ', HTTP gateway'} …",
        flush=True,
    )
    try:
        stack.start()
        STATE_FILE.parent.mkdir(exist_ok=True)
        # The cluster secret lets `styx status/deploy/call/gateway` run here authenticate: owner-only.
        fd = os.open(STATE_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as state:
            state.write(json.dumps({**stack.endpoints(), "secret": stack.secret}))
        for name, address in stack.endpoints().items():
            print(f"  {name:<20} {address}", flush=True)
        if stack.gateway_url:
            print(f"  {'http docs':<12} {stack.gateway_url}/docs", flush=True)
        print(f"  {'logs':<12} {stack.log_dir}", flush=True)
        if args.demo:
            from styx_py.benchmarks.demo import run_demo

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
            for name in stack.supervise():
                print(f"{name} died or hung: restarted (the cluster recovers)", flush=True)
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


def _kafka(args: argparse.Namespace, config: Config) -> str:
    kafka = args.kafka or config.kafka_bootstrap
    if not kafka:
        raise ConfigError("no Kafka bootstrap address: pass --kafka HOST:PORT or set STYX_KAFKA_BOOTSTRAP")
    return str(kafka)


def cmd_coordinator(args: argparse.Namespace) -> int:
    from styx_py.coordinator.main import serve_coordinator

    config = load_config()  # fails here, naming the setting, on a bad value
    setup_logging("coordinator", config.log_level)
    kafka = _kafka(args, config)
    run(serve_coordinator(config, kafka, args.workers, args.host, args.port, args.deploy))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from styx_py.worker.main import serve_worker

    config = load_config()
    setup_logging(args.id, config.log_level)
    coordinator = args.coordinator or config.coordinator
    if not coordinator:
        raise ConfigError("no coordinator address: pass --coordinator HOST:PORT or set STYX_COORDINATOR")
    kafka = _kafka(args, config)
    run(serve_worker(args.id, coordinator, kafka, config, args.host, args.port, args.advertise_host))
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from styx_py.core.wire import DeployRequest
    from styx_py.stack.local import admin, coordinator_address

    body = asyncio.run(admin(coordinator_address(args.coordinator), DeployRequest(args.import_path)))
    print(f"deployed {body['graph']} on {len(body['workers'])} workers")
    for op in body["operators"]:
        print(f"  {op['name']}: {op['partitions']} partitions, functions {', '.join(op['functions'])}")
    for warning in body.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from styx_py.core.wire import StatusRequest
    from styx_py.stack.local import admin, coordinator_address

    body = asyncio.run(admin(coordinator_address(args.coordinator), StatusRequest()))
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"graph        {body['graph'] or '(nothing deployed)'}")
    print(
        f"epoch        {body['epoch']}  ({body['epochs_per_s']} epochs/s, {body['txn_per_s']} txn/s, "
        f"abort rate {body['abort_rate']:.2%})"
    )
    print(f"totals       {body['totals']}")
    print(f"snapshot     {body['last_snapshot'] or 'none yet'}")
    if body["failed_workers"]:
        print(f"FAILED       {', '.join(body['failed_workers'])}")
    print("workers")
    for w in body["workers"]:
        print(
            f"  {w['node_id']:<6} sid {w['sid']}  {w['address']:<21} partitions {w['partitions']}  "
            f"heartbeat {w['last_heartbeat_s_ago']}s ago"
        )
    return 0


def _state_functions(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        operator, sep, function = item.partition("=")
        if not sep or not operator or not function:
            raise StyxError(f"--state-function expects OPERATOR=FUNCTION, got {item!r}")
        out[operator] = function
    return out


def _gateway_token(args: argparse.Namespace) -> str | None:
    """``--token-file``, else ``$STYX_GATEWAY_TOKEN`` (never a plain argument: argv is visible in ps)."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise StyxError(f"cannot read --token-file {args.token_file}: {exc}") from exc
        if not token:
            raise StyxError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get("STYX_GATEWAY_TOKEN") or None


def cmd_gateway(args: argparse.Namespace) -> int:
    from styx_py.client.gateway import GatewayConfig, serve_gateway
    from styx_py.stack.local import cluster_secret, coordinator_address

    setup_logging("gateway")
    coordinator = coordinator_address(args.coordinator)
    config = GatewayConfig(
        coordinator,
        cluster_secret=cluster_secret(coordinator),
        host=args.host,
        port=args.port,
        token=_gateway_token(args),
        max_pending=args.max_pending,
        max_body_bytes=args.max_body_bytes,
        reply_timeout_s=args.reply_timeout,
        state_functions=_state_functions(args.state_function),
    )

    def announce(url: str) -> None:
        print(f"gateway listening on {url} (docs {url}/docs); coordinator {config.coordinator}", flush=True)

    run(serve_gateway(config, announce=announce))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from styx_py.client import StyxClient
    from styx_py.stack.local import cluster_secret, coordinator_address

    async def call() -> int:
        coordinator = coordinator_address(args.coordinator)
        client = await StyxClient.connect(coordinator, cluster_secret=cluster_secret(coordinator))
        try:
            reply = await client.submit(
                args.operator,
                _parse_arg(args.key),
                args.function,
                *[_parse_arg(a) for a in args.args],
                timeout_s=args.timeout,
            )
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


def cmd_bench(args: argparse.Namespace) -> int:
    from styx_py.benchmarks.bench import cmd_bench as run_bench

    return run_bench(args)


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="styx", description="styx-py: deterministic transactional stateful functions"
    )
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
    up.add_argument("--gateway-port", type=int, default=0, help="HTTP gateway port (default: a free one)")
    up.add_argument(
        "--state-function",
        action="append",
        default=[],
        metavar="OPERATOR=FUNCTION",
        help="read-only function behind GET /v1/state/OPERATOR/KEY (repeatable; demo: account=balance)",
    )
    up.set_defaults(fn=cmd_up)

    co = sub.add_parser("coordinator", help="run the coordinator process")
    co.add_argument("--kafka", help="Kafka bootstrap HOST:PORT (default: $STYX_KAFKA_BOOTSTRAP)")
    co.add_argument("--workers", type=int, default=1, help="workers to wait for before deploying")
    co.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    co.add_argument("--port", type=int, default=6000, help="port workers and clients connect to")
    co.add_argument("--deploy", help="deploy this graph at start")
    co.set_defaults(fn=cmd_coordinator)

    wk = sub.add_parser("worker", help="run a worker process")
    wk.add_argument("--id", required=True, help="worker id, unique in the cluster")
    wk.add_argument("--coordinator", help="coordinator HOST:PORT (default: $STYX_COORDINATOR)")
    wk.add_argument("--kafka", help="Kafka bootstrap HOST:PORT (default: $STYX_KAFKA_BOOTSTRAP)")
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
        "--coordinator", help="HOST:PORT (default: $STYX_COORDINATOR or the cluster from 'styx up')"
    )
    gw.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    gw.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: a free one)")
    gw.add_argument("--token-file", help="file holding the bearer token (else $STYX_GATEWAY_TOKEN)")
    gw.add_argument("--max-pending", type=int, default=1000, help="invocations in flight before 429")
    gw.add_argument("--max-body-bytes", type=int, default=1024 * 1024, help="largest request body (413)")
    gw.add_argument("--reply-timeout", type=float, default=30.0, help="default reply wait in seconds (504)")
    gw.add_argument(
        "--state-function",
        action="append",
        default=[],
        metavar="OPERATOR=FUNCTION",
        help="read-only, argument-less function behind GET /v1/state/OPERATOR/KEY (repeatable)",
    )
    gw.set_defaults(fn=cmd_gateway)

    from styx_py.benchmarks.bench import add_arguments as bench_arguments

    bench = sub.add_parser(
        "bench",
        help="run a benchmark workload open-loop (ycsbt, tpcc, deathstar-*); results and plots",
        description="Open-loop benchmark: requests leave on the clock, latency is measured from each "
        "request's scheduled send time. Starts a local cluster unless --coordinator is given.",
    )
    bench_arguments(bench)
    bench.set_defaults(fn=cmd_bench)

    au = sub.add_parser(
        "audit",
        help="audit a run on Spark: exactly-once, ordering, invariants, latency; report + Parquet",
        description="Read the ingress, egress and sequencer-log topics (and a snapshot from S3) with "
        "PySpark and check exactly-once replies, the Mencius tid order, the workload's invariants and "
        "the serial replay; write OUT/report.md, OUT/plots/*.png and OUT/tables/*.parquet. Exit code 1 "
        "when a check fails. Needs the 'spark' extra.",
    )
    _audit_arguments(au)
    au.set_defaults(fn=cmd_audit)

    for name, fn, helptext in (
        ("deploy", cmd_deploy, "deploy a graph by import path"),
        ("status", cmd_status, "show workers, partitions, epoch rate, aborts"),
        ("call", cmd_call, "run one transaction and print its reply"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument(
            "--coordinator", help="HOST:PORT (default: $STYX_COORDINATOR or the cluster from 'styx up')"
        )
        sp.set_defaults(fn=fn)
        if name == "deploy":
            sp.add_argument("import_path", help="package.module:graph")
        elif name == "status":
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            sp.add_argument("operator")
            sp.add_argument("key", help="entity key (JSON number → int key, otherwise a string)")
            sp.add_argument("function")
            sp.add_argument("args", nargs="*", help="arguments, each JSON or a plain string")
            sp.add_argument("--timeout", type=float, default=30.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except StyxError as exc:
        print(f"styx: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
