"""What mutual TLS costs on the internal ports: CPU per message and per MiB between two transports.

    python -m styx_benchmarks.tls_cost [--mib 16] [--rounds 5]

Two :class:`~styx_py.io.tcp.TcpTransport` endpoints in one process on uvloop (as the processes run),
plain and then in TLS (a throwaway CA made with ``openssl``); one sends ``--mib`` MiB of messages of
each size in a burst (the transport batches what one tick sends into frames), the other counts them.
The CPU time of the process (both ends: encryption and decryption) and the wall time per burst, the
best of ``--rounds``. A connection's handshakes (TLS and HMAC) are paid once per link and are not in
these numbers. Prints a JSON document (benchmarks/results/tls-cost.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from styx_py.core.security import tls_files
from styx_py.core.wire import Message, Register
from styx_py.io.tcp import TcpTransport
from styx_py.io.tls import Tls

SECRET = "tls-cost-benchmark-secret-0123"
SIZES = (100, 4096, 65536)  # bytes of payload per message


def _identity(directory: Path) -> Tls:
    make_certs = Path(__file__).resolve().parents[2] / "deploy" / "make-certs.sh"
    subprocess.run(["sh", str(make_certs), str(directory)], check=True, capture_output=True)
    files = tls_files(*(str(directory / f) for f in ("tls.crt", "tls.key", "ca.crt")))
    assert files is not None
    return Tls(files)


async def _burst(tls: Tls | None, size: int, messages: int, rounds: int) -> dict[str, float]:
    got = 0
    done = asyncio.Event()

    def count(src: str, msg: Message) -> None:
        nonlocal got
        got += 1
        if got == messages:
            done.set()

    receiver = TcpTransport("coordinator", count, inbox="coordinator", secret=SECRET, tls=tls)
    sender = TcpTransport("w1", lambda src, msg: None, inbox="worker", secret=SECRET, tls=tls)
    await receiver.start()
    await sender.start()
    sender.set_address("coordinator", "127.0.0.1", receiver.port)
    msg = Register("w1", "h" * size, 1)
    best_cpu = best_wall = float("inf")
    try:
        for burst in range(rounds + 1):  # the first burst opens the link: not measured
            got = 0
            done.clear()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(messages):
                sender.send("coordinator", msg)
            await asyncio.wait_for(done.wait(), 600)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if burst > 0 or rounds == 0:
                best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
    finally:
        await sender.close()
        await receiver.close()
    mib = messages * size / 2**20
    return {
        "cpu_us_per_message": round(best_cpu / messages * 1e6, 2),
        "cpu_ms_per_mib": round(best_cpu / mib * 1e3, 2),
        "mib_per_s": round(mib / best_wall, 1),
    }


async def run(mib: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        tls = _identity(Path(tmp))
        out: dict[str, Any] = {"mib_per_burst": mib, "rounds": rounds, "sizes": {}}
        for size in SIZES:
            n = mib * 2**20 // size
            plain = await _burst(None, size, n, rounds)
            encrypted = await _burst(tls, size, n, rounds)
            out["sizes"][str(size)] = {"messages": n, "plain": plain, "tls": encrypted}
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=16, help="MiB sent per burst, for each size")
    parser.add_argument("--rounds", type=int, default=5, help="measured bursts (the best counts)")
    args = parser.parse_args()
    print(json.dumps(uvloop.run(run(args.mib, args.rounds)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
