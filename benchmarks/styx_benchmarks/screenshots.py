"""Screenshots of what users see, taken with headless Chromium (Debian's ``chromium``)::

    python -m styx_benchmarks.screenshots            # or: make screenshots
    python -m styx_benchmarks.screenshots --out docs/img --browser /usr/bin/chromium
    python -m styx_benchmarks.screenshots --only docs      # just the gateway's /docs (no cluster)

``gateway-docs.png``: the gateway's Swagger UI (``/docs``). A gateway is started in this process on a
free loopback port; it needs no cluster for its API reference (the coordinator it names is not
there), and its scripts come from the gateway itself, so the shot works offline and shows whether
the page really renders without a CDN. Chromium runs with a fresh profile and no network beyond the
page (no component updates, sync, QUIC or background fetches), and ``--virtual-time-budget`` lets the
page's scripts finish before the capture.

``console-cluster.png``, ``console-invocations.png``, ``console-invocation.png`` and
``console-phone.png``: the gateway's web console on a local cluster (``styx up``'s stack: Tansu, a
coordinator, 2 workers and a gateway on loopback, the bank app deployed, a few deposits and an
aborted transfer sent over HTTP), at 1 280 px and at a phone's 390 px.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from styx_client.gateway import Gateway, GatewayConfig, GatewayTiming
from styx_py.core.errors import StyxError
from styx_py.stack.screenshot import screenshot

__all__ = ["CONSOLE_SHOTS", "console_shots", "gateway_docs", "local_console", "main"]

WINDOW = (1280, 1600)
HISTORY_SAMPLES = 8  # 2 s apart: the console's charts over ~16 s of traffic
UNUSED_COORDINATOR = "127.0.0.1:9"  # discard port: nothing answers, the docs do not need it


async def gateway_docs(out: Path, browser: str | None = None) -> Path:
    """Start a gateway, screenshot its ``/docs`` to ``out/gateway-docs.png``, stop the gateway."""
    gateway = Gateway(GatewayConfig(UNUSED_COORDINATOR, port=0, timing=GatewayTiming(status_interval_s=60)))
    sock = gateway.bind()
    gateway.port = int(sock.getsockname()[1])
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(gateway.run(sock))
        try:
            url = f"{gateway.url}/docs"
            return await asyncio.to_thread(screenshot, url, out / "gateway-docs.png", WINDOW, browser)
        finally:
            gateway.stop()
            await serving


CONSOLE_SHOTS = (
    ("console-cluster.png", "#/cluster", (1280, 1100)),
    ("console-invocations.png", "#/invocations", (1280, 720)),
    ("console-phone.png", "#/cluster", (390, 1300)),
)


def console_shots(
    gateway_url: str, out: Path, request_id: str, token: str | None = None, browser: str | None = None
) -> list[Path]:
    """The console of a running gateway: :data:`CONSOLE_SHOTS` and ``request_id``'s invocation."""
    shots = [*CONSOLE_SHOTS, ("console-invocation.png", f"#/invocation/{request_id}", (1280, 1100))]
    suffix = "" if token is None else f"?token={token}"
    return [
        screenshot(f"{gateway_url}/console{fragment}{suffix}", out / name, window, browser)
        for name, fragment, window in shots
    ]


def local_console(out: Path, browser: str | None = None) -> list[Path]:
    """Start a local stack with a gateway, send it a few invocations, screenshot its console."""
    from styx_py.stack.local import LocalStack

    with (
        tempfile.TemporaryDirectory(prefix="styx-shots-") as tmp,
        LocalStack(Path(tmp), gateway=True) as stack,
    ):
        stack.deploy("styx_benchmarks.bank:app")
        url = stack.gateway_url
        with httpx.Client(base_url=url, timeout=60) as http:
            _wait(lambda: http.get("/readyz").status_code == 200, "the gateway to be ready")
            calls = [
                ("alice", "deposit", [100]),
                ("bob", "deposit", [40]),
                ("alice", "transfer", ["bob", 30]),
            ]
            calls += [("bob", "transfer", ["carol", 500])]  # aborts: insufficient credit
            for i, (key, function, args) in enumerate(calls):
                body = {"operator": "account", "key": key, "function": function, "args": args}
                http.post("/v1/invocations", json=body, headers={"Idempotency-Key": f"shot-{i}"})

            def sampled() -> bool:  # a few history samples with traffic in them, for the charts
                body = {"operator": "account", "key": "carol", "function": "deposit", "args": [1]}
                http.post("/v1/invocations", json=body)
                return len(http.get("/v1/cluster").json()["history"]) >= HISTORY_SAMPLES

            _wait(sampled, "the console's history")
        return console_shots(url, out, "shot-2", browser=browser)


def _wait(ready: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise StyxError(f"screenshots: gave up waiting for {what} after {timeout_s:g} s")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m styx_benchmarks.screenshots", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("docs/img"), help="folder of the PNGs (docs/img)")
    p.add_argument("--browser", help="the Chromium binary (default: chromium on the PATH)")
    p.add_argument("--only", choices=("docs", "console"), help="only the /docs shot, or only the console's")
    args = p.parse_args(argv)
    try:  # without --browser, screenshot() finds one or says how to install it
        if args.only != "console":
            print(asyncio.run(gateway_docs(args.out, args.browser)))
        if args.only != "docs":
            for png in local_console(args.out, args.browser):
                print(png)
    except StyxError as exc:
        print(f"screenshots: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
