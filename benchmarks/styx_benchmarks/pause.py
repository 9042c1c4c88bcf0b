"""How a loaded cluster comes back after its workers stop for a moment (a long GC pause, a snapshot that
holds the event loop, a VM steal).

    python -m styx_benchmarks.pause                        # TPC-C W=1 at 598/s, workers stopped 0.8 s
    python -m styx_benchmarks.pause --pause 1.5 --runs 3   # longer than the failure timeout (1 s)

Each run is one ``styx bench`` (its own local cluster, fresh state, the workload's check after it).
``--at`` seconds into the run's measured window every worker of that cluster is stopped with SIGSTOP,
continued with SIGCONT ``--pause`` seconds later; the run's per-second series (latency of the requests
sent in each second) says how long the cluster took to serve at its usual latency again. A pause
longer than ``failure_timeout_ms`` gets the workers declared failed, so the run measures a recovery.

Prints, per run, what was served, the check, and the p50 of each second; the run files go to
``--out``. The measured numbers are in benchmarks/results/overload.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from styx_benchmarks.cpu import descendants_of

WORKER = "styx_py.cli worker"


def workers_of(pid: int) -> list[int]:
    out = []
    for c in descendants_of(pid):
        try:
            cmdline = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if WORKER in cmdline:
            out.append(c)
    return out


def one_run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "styx_py.cli", "bench", args.workload, "--rate", str(args.rate),
        "--duration", str(args.duration), "--warmup", str(args.warmup), "--out", str(out),
        "--no-plots", "--timeout", "60",
    ]  # fmt: skip
    if args.workload == "tpcc":
        cmd += ["--warehouses", str(args.warehouses)]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert bench.stdout is not None
    stopped: list[int] = []
    check, path = "not run", ""
    for line in bench.stdout:
        if not stopped and "[measure" in line:
            elapsed = float(line.split("measure")[1].split("s]")[0])
            if elapsed >= args.warmup + args.at:
                stopped = workers_of(bench.pid)
                for pid in stopped:
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(args.pause)
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
                print(f"  stopped workers {stopped} for {args.pause} s at {elapsed:.1f} s", flush=True)
        if "check:" in line:
            check = line.split("check:", 1)[1].strip()
        elif "results:" in line:
            path = line.split("results:", 1)[1].strip()
    if bench.wait() != 0:
        raise SystemExit(f"styx bench exited with {bench.returncode}")
    if not stopped:
        raise SystemExit("the run ended before its workers could be stopped (a longer --duration?)")
    data = json.loads(Path(path).read_text())
    p50 = [round(s["p50_ms"]) if s["p50_ms"] is not None else None for s in data["series"]]
    return {"file": path, "served": data["result"]["served"], "check": check, "p50_ms": p50}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="tpcc", help="a styx bench workload (tpcc)")
    p.add_argument("--warehouses", type=int, default=1)
    p.add_argument("--rate", type=float, default=598.0)
    p.add_argument("--duration", type=float, default=14.0, help="measured seconds per run (14)")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--at", type=float, default=2.0, help="seconds into the measured window (2)")
    p.add_argument("--pause", type=float, default=0.8, help="seconds the workers stay stopped (0.8)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", default=None, help="run files (default: a temporary directory)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="styx-pause-"))
    for i in range(args.runs):
        r = one_run(args, out)
        print(f"run {i + 1}: served {r['served']}/s, check {r['check']}, {r['file']}", flush=True)
        print("  p50 ms by second: " + " ".join(f"{s}:{v}" for s, v in enumerate(r["p50_ms"])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
