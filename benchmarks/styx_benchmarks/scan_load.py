"""YCSB-T's latency with and without consistent scans of every account running beside it.

    python -m styx_benchmarks.scan_load                       # 2 000/s for 30 s, 3 rounds of each
    python -m styx_benchmarks.scan_load --rounds 3 --seconds 20 --scan-every 0,1

Each run starts the local stack (2 workers, the bank app over 4 partitions) and sends YCSB-T transfers
open-loop through the SDK for ``--seconds`` (:func:`styx_benchmarks.latency_path.measure`, 10 000
accounts). In a ``scans`` run a separate process (this module with ``--scanner``) meanwhile scans
every account, a scan starting every ``--scan-every`` seconds (each value a variant; 0: back to
back), as ``styx state list account`` does (:func:`styx_py.io.stateread.scan`, pages of
``--page-size`` rows, by default ``READ_PAGE``, each page visiting all 4 partitions, every page at
the scan's first epoch), and
checks that each scan that holds every account sums to the conserved total (and counts the scans
that, once every account was loaded, held fewer: ``scans_short``). Runs alternate ``alone`` and the
``scans`` variants, so machine noise falls on all.

``--scan-rows-per-s R`` adds a variant whose scans are paced to ``R`` rows a second (``client.scan``'s
``rows_per_s``: a background scan spread over time). ``--burn-ms C`` adds a control variant: the side
process spends ``C`` ms of CPU every ``--scan-every`` seconds without touching the cluster, so a
scan's effect can be set against that of its CPU alone.

Every run records the machine's load averages before and after it (``/proc/loadavg``): the numbers
are of whatever else the machine runs meanwhile. Results go to ``benchmarks/results/scan-load-<time>.json``
(``--note`` is kept in it); docs/benchmarks.md#consistent-scans cites the measured file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from styx_benchmarks.latency_path import measure, percentiles
from styx_benchmarks.ycsbt import INITIAL
from styx_py.core.limits import READ_PAGE
from styx_py.io import stateread
from styx_py.stack.local import LocalStack, cluster_secret

KEYS = 10_000  # the accounts latency_path.measure opens (YCSB-T's default)
RESULTS = Path(__file__).resolve().parent.parent / "results"  # benchmarks/results


def burn_forever(cpu_ms: float, out: Path, every_s: float) -> None:
    """The control: spend ``cpu_ms`` of CPU in a loop, once every ``every_s`` seconds, until killed
    (one JSON line per burst); none of it touches the cluster."""
    with out.open("a") as f:
        while True:
            t0 = time.perf_counter()
            end = time.process_time() + cpu_ms / 1000
            while time.process_time() < end:
                pass
            ms = round((time.perf_counter() - t0) * 1000, 1)
            f.write(json.dumps({"burn_ms": cpu_ms, "ms": ms}) + "\n")
            f.flush()
            time.sleep(max(0.0, every_s - (time.perf_counter() - t0)))


async def scan_forever(
    coordinator: str, page_size: int, out: Path, every_s: float = 0.0, rows_per_s: float | None = None
) -> None:
    """Scan every account until killed, a scan starting every ``every_s`` seconds (0: back to back),
    paced to ``rows_per_s`` if given; one JSON line per scan: its epoch, rows, sum, pages and duration."""
    source = stateread.admin_reads(coordinator, secret=cluster_secret(coordinator), timeout_s=30)
    with out.open("a") as f:
        while True:
            t0, rows, total, pages, epoch = time.perf_counter(), 0, 0, 0, -1
            async for page in stateread.scan(source, "account", page_size=page_size, rows_per_s=rows_per_s):
                epoch, pages = page.epoch, pages + 1
                rows += len(page.rows)
                total += sum(v for _, v in page.rows)
            ms = round((time.perf_counter() - t0) * 1000, 1)
            f.write(json.dumps({"epoch": epoch, "rows": rows, "sum": total, "pages": pages, "ms": ms}) + "\n")
            f.flush()
            if rows < KEYS:
                await asyncio.sleep(0.05)  # still loading
            else:
                await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - t0)))


def scans_of(path: Path) -> dict[str, Any]:
    """What the scanner wrote (pure but for the read): scans of the loaded accounts, and violations."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    full = [s for s in lines if s["rows"] == KEYS]
    wrong = [s for s in full if s["sum"] != KEYS * INITIAL]
    loaded = next((i for i, s in enumerate(lines) if s["rows"] == KEYS), len(lines))
    return {
        "scans": len(full),
        "scans_not_conserved": len(wrong),
        "scans_short": sum(s["rows"] != KEYS for s in lines[loaded:]),  # missing accounts once loaded
        "scan_ms": percentiles([s["ms"] for s in full], (50, 99)),
        "pages_per_scan": full[0]["pages"] if full else 0,
        "distinct_epochs": len({s["epoch"] for s in full}),
    }


def run_once(
    rate: float,
    seconds: float,
    every_s: float | None,
    page_size: int,
    burn_ms: float = 0.0,
    rows_per_s: float | None = None,
) -> dict[str, Any]:
    """One run: alone (``every_s`` None) or with a scan every ``every_s`` seconds (0: back to back),
    paced to ``rows_per_s`` if given, or with ``burn_ms`` of CPU spent every ``every_s`` seconds
    instead of a scan (the control)."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    data_dir = Path(tempfile.mkdtemp(prefix="styx-scanload-"))
    scanner: subprocess.Popen[bytes] | None = None
    log = data_dir / "scans.jsonl"
    try:
        with LocalStack(data_dir / "stack", workers=2, env={"STYX_LOG_LEVEL": "WARNING"}) as stack:
            stack.deploy("styx_benchmarks.bank:app")
            if every_s is not None:
                cmd = [sys.executable, "-m", "styx_benchmarks.scan_load", "--scanner", stack.coordinator]
                cmd += ["--page-size", str(page_size), "--scan-log", str(log), "--scan-every", str(every_s)]
                cmd += ["--burn-ms", str(burn_ms)] if burn_ms else []
                cmd += ["--scan-rows-per-s", str(rows_per_s)] if rows_per_s else []
                scanner = subprocess.Popen(cmd)
            try:
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    out = runner.run(measure(stack, rate, seconds))
            finally:
                if scanner is not None:
                    scanner.terminate()
                    scanner.wait(timeout=30)
        load = {"loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
        variant = "alone" if every_s is None else f"scans every {every_s:g} s"
        if burn_ms:
            variant = f"{burn_ms:g} ms of CPU every {every_s:g} s"
        elif rows_per_s:
            variant += f" at {rows_per_s:g} rows/s"
        result = {"variant": variant, "scan_every_s": every_s, "answered": out["answered"]} | load
        result |= {"sent": int(rate * seconds), "latency_ms": out["ms"]["total"], "epochs": out["epochs"]}
        if burn_ms:
            bursts = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            return result | {"burn_ms": burn_ms, "bursts": len(bursts)}
        return result | (scans_of(log) if every_s is not None else {})
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, alternating")
    parser.add_argument("--page-size", type=int, default=READ_PAGE, help="rows per page of a scan")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="kept in the results file (e.g. what else ran)")
    parser.add_argument(
        "--burn-ms",
        type=float,
        default=0.0,
        help="adds a control variant: this much CPU spent every --scan-every seconds (the first value) "
        "by a process that does not touch the cluster, in place of a scan",
    )
    parser.add_argument(
        "--scan-rows-per-s",
        type=float,
        default=0.0,
        help="adds a variant: scans every --scan-every seconds (the first value) paced to this many "
        "rows a second (client.scan's rows_per_s)",
    )
    parser.add_argument("--scanner", metavar="COORDINATOR", help=argparse.SUPPRESS)  # the scanning process
    parser.add_argument("--scan-log", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--scan-every",
        default="0,1",
        help="seconds between scan starts, one variant each, comma-separated (0: back to back)",
    )
    args = parser.parse_args()
    if args.scanner:
        if args.burn_ms:
            burn_forever(args.burn_ms, args.scan_log, float(args.scan_every))
        else:
            pace = args.scan_rows_per_s or None
            asyncio.run(
                scan_forever(args.scanner, args.page_size, args.scan_log, float(args.scan_every), pace)
            )
        return 0
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    runs: list[dict[str, Any]] = []
    every = [float(x) for x in args.scan_every.split(",")]
    variants: list[tuple[float | None, float, float | None]] = [(None, 0.0, None)]
    variants += [(e, 0.0, None) for e in every]
    if args.scan_rows_per_s:
        variants.append((every[0], 0.0, args.scan_rows_per_s))
    if args.burn_ms:
        variants.append((every[0], args.burn_ms, None))
    for n in range(args.rounds):
        for every_s, burn_ms, pace in variants:
            run = run_once(args.rate, args.seconds, every_s, args.page_size, burn_ms, pace)
            one = {"round": n + 1} | run
            runs.append(one)
            lat = one["latency_ms"]
            extra = (
                f", {one['scans']} scans ({one['scans_not_conserved']} not conserved)"
                if "scans" in one
                else ""
            )
            print(
                f"{one['variant']:<6} round {n + 1}: {one['answered']}/{one['sent']} answered, "
                f"p50/p99 {lat.get('p50')}/{lat.get('p99')} ms{extra}, load {one['loadavg_after'][0]}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"scan-load-{time.strftime('%Y%m%d-%H%M%S')}.json"
    settings = {"rate": args.rate, "seconds": args.seconds, "page_size": args.page_size, "keys": KEYS}
    settings |= {"note": args.note, "cpus": os.cpu_count()}
    path.write_text(json.dumps(settings | {"runs": runs}, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
