"""Where a durable-mode cluster's time goes: every S3 request Tansu makes, counted and timed.

    python -m styx_benchmarks.durable_probe --rate 1000 --duration 60

Starts SeaweedFS, a counting TCP proxy in front of its S3 port, Tansu with S3 storage through the
proxy (what ``styx up --durable`` runs, plus the proxy), a coordinator and two workers, and runs
``styx bench ycsbt`` against them. Every two seconds it samples the coordinator's epoch and commit
counters, the CPU of every process, and the S3 requests Tansu made since the last sample, by kind
(``LIST`` of a partition's batch objects, ``PUT``/``GET`` of a batch, a watermark, the cluster
metadata), with their mean latency. Writes ``benchmarks/results/durable-probe-<rate>-<time>.json``
(the samples and the run's result). It shows why durable mode needs adaptive fetch waits: Tansu's S3
fetch lists every batch object of the partition and answers empty when that takes longer than the
fetch's wait, so consumers with a 5 ms wait would spin on ``LIST`` for ever (docs/operations.md,
durable mode; benchmarks/results/durable-mode.md).

The proxy only watches requests: it relays bytes unchanged and recognises a request by its first
line (Tansu's S3 client sends one request at a time per connection).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from styx_benchmarks.cpu import cpu_seconds
from styx_py.stack.local import LocalStack
from styx_py.stack.net import free_port
from styx_py.stack.seaweed import S3Config, SeaweedS3
from styx_py.stack.tansu import TansuBroker

RESULTS_DIR = Path("benchmarks/results")
SAMPLE_S = 2.0
_REQUEST = re.compile(rb"^(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.1\r\n")
_TOPIC = re.compile(r"topics/([^/?&]+)")
_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # the per-cluster topic suffix of the tests


def request_kind(method: bytes, path: bytes) -> str:
    """``LIST <topic>``, ``PUT batch <topic>``, ``GET watermark <topic>``, ``PUT meta`` …"""
    text = unquote(path.decode(errors="replace"))
    found = _TOPIC.search(text)
    topic = _SUFFIX.sub("", found.group(1)) if found else ""
    if "list-type=2" in text:
        return f"LIST {topic}".strip()
    what = next((w for w in ("watermark", "meta", "batch") if w in text), "other")
    return f"{method.decode()} {what} {topic}".strip()


class S3Counter:
    """Counts and times the requests relayed by :meth:`serve` (thread-safe: it runs in a thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.count[kind] += 1
            self.seconds[kind] += seconds

    def take(self) -> tuple[dict[str, int], dict[str, float]]:
        with self.lock:
            count, seconds = dict(self.count), dict(self.seconds)
            self.count.clear()
            self.seconds.clear()
        return count, seconds

    async def serve(self, port: int, target: int) -> None:
        async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
            sent: collections.deque[tuple[str, float]] = collections.deque()

            async def up() -> None:
                try:
                    while data := await client_r.read(65536):
                        if m := _REQUEST.match(data):
                            sent.append((request_kind(m.group(1), m.group(2)), time.perf_counter()))
                        server_w.write(data)
                        await server_w.drain()
                finally:
                    server_w.close()

            async def down() -> None:
                try:
                    while data := await server_r.read(65536):
                        if data.startswith(b"HTTP/1.1") and sent:
                            kind, t0 = sent.popleft()
                            self.add(kind, time.perf_counter() - t0)
                        client_w.write(data)
                        await client_w.drain()
                finally:
                    client_w.close()

            await asyncio.gather(up(), down(), return_exceptions=True)

        server = await asyncio.start_server(relay, "127.0.0.1", port)
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m styx_benchmarks.durable_probe", description=__doc__)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("bench_args", nargs="*", help="more arguments for styx bench (after --)")
    args = p.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="styx-durable-probe-"))
    counter = S3Counter()
    s3 = SeaweedS3(data / "s3", buckets=["styx-snapshots", "tansu"], log_path=data / "seaweedfs.log").start()
    proxy_port, s3_port = free_port(), int(s3.config.endpoint.rpartition(":")[2])
    threading.Thread(target=lambda: asyncio.run(counter.serve(proxy_port, s3_port)), daemon=True).start()
    via = S3Config(f"127.0.0.1:{proxy_port}", s3.config.access_key, s3.config.secret_key, s3.config.region)
    broker = TansuBroker(via, bucket="tansu", log_path=data / "tansu.log").start()
    env = {"STYX_LOG_LEVEL": "WARNING", "STYX_FAILURE_TIMEOUT_MS": "5000"}
    stack = LocalStack(data, workers=2, kafka=broker.bootstrap, s3=s3.config, env=env).start()
    samples: list[dict[str, Any]] = []
    try:
        stack.deploy("styx_benchmarks.bank:app")
        bench_out = data / "bench"
        command = ["bench", "ycsbt", "--coordinator", stack.coordinator, "--rate", f"{args.rate:g}"]
        command += ["--duration", f"{args.duration:g}", "--no-plots", "--quiet", "--out", str(bench_out)]
        command += args.bench_args
        counter.take()
        bench = subprocess.Popen([sys.executable, "-m", "styx_py.cli", *command])
        pids = {name: proc.pid for name, proc in stack.procs.items()}
        pids |= {"tansu": broker.pid or 0, "seaweedfs": s3.pid or 0, "bench": bench.pid}
        last = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.monotonic()
        while bench.poll() is None:
            time.sleep(SAMPLE_S)
            count, seconds = counter.take()
            status = stack.status()
            now = {name: cpu_seconds(pid) for name, pid in pids.items()}
            sample = {
                "t_s": round(time.monotonic() - started, 1),
                "epoch": status["epoch"],
                "committed": status["totals"]["committed"],
                "state": status["state"],
                "cpu_cores": {n: round((now[n] - last[n]) / SAMPLE_S, 2) for n in pids},
                "s3_per_s": {k: round(v / SAMPLE_S, 1) for k, v in sorted(count.items())},
                "s3_mean_ms": {k: round(1000 * seconds[k] / count[k], 1) for k in sorted(count)},
            }
            last = now
            samples.append(sample)
            print(json.dumps(sample), flush=True)
        results = [json.loads(f.read_text())["result"] for f in sorted(bench_out.glob("*.json"))]
    finally:
        stack.stop()
        broker.stop()
        s3.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"durable-probe-{args.rate:g}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    command_line = " ".join(["python -m styx_benchmarks.durable_probe", *(argv or sys.argv[1:])])
    doc = {"command": command_line, "samples": samples, "bench": results}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {path}")
    return 0 if results and results[0]["unanswered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
