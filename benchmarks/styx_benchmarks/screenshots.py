"""Screenshots of what users see, taken with headless Chromium (Debian's ``chromium``)::

    python -m styx_benchmarks.screenshots            # or: make screenshots
    python -m styx_benchmarks.screenshots --out docs/img --browser /usr/bin/chromium

``gateway-docs.png``: the gateway's Swagger UI (``/docs``). A gateway is started in this process on a
free loopback port; it needs no cluster for its API reference (the coordinator it names is not
there), and its scripts come from the gateway itself, so the shot works offline and shows whether
the page really renders without a CDN. Chromium runs with a fresh profile and no network beyond the
page (no component updates, sync, QUIC or background fetches), and ``--virtual-time-budget`` lets the
page's scripts finish before the capture.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

from styx_client.gateway import Gateway, GatewayConfig, GatewayTiming
from styx_py.core.errors import StyxError
from styx_py.stack.screenshot import screenshot

__all__ = ["gateway_docs", "main"]

WINDOW = (1280, 1600)
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m styx_benchmarks.screenshots", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("docs/img"), help="folder of the PNGs (docs/img)")
    p.add_argument("--browser", help="the Chromium binary (default: chromium on the PATH)")
    args = p.parse_args(argv)
    try:  # without --browser, screenshot() finds one or says how to install it
        print(asyncio.run(gateway_docs(args.out, args.browser)))
    except StyxError as exc:
        print(f"screenshots: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
