"""Screenshots of what users see, taken with headless Chromium (Debian's ``chromium``)::

    python -m styx_py.benchmarks.screenshots            # or: make screenshots
    python -m styx_py.benchmarks.screenshots --out docs/img --browser /usr/bin/chromium

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
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from styx_py.client.gateway import Gateway, GatewayConfig
from styx_py.core.errors import StyxError

__all__ = ["CHROMIUM_FLAGS", "chromium_screenshot", "gateway_docs", "main"]

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root in containers; the page is our own
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",  # ms of page time for its scripts (Swagger UI fetches the schema)
)
WINDOW = (1280, 1600)
TIMEOUT_S = 120.0  # a first Chromium start on a busy 2-core machine takes several seconds
UNUSED_COORDINATOR = "127.0.0.1:9"  # discard port: nothing answers, the docs do not need it


def chromium_screenshot(url: str, png: Path, browser: str, window: tuple[int, int] = WINDOW) -> Path:
    """Render ``url`` to ``png`` with a headless Chromium and a throw-away profile."""
    png = png.resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="styx-chromium-") as profile:
        args = [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={window[0]},{window[1]}",
            f"--screenshot={png}",
            url,
        ]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StyxError(f"Chromium took more than {TIMEOUT_S:g} s to render {url}") from exc
    if done.returncode != 0 or not png.exists() or png.stat().st_size == 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise StyxError(f"Chromium wrote no screenshot of {url} (exit {done.returncode}): {tail}")
    return png


async def gateway_docs(out: Path, browser: str) -> Path:
    """Start a gateway, screenshot its ``/docs`` to ``out/gateway-docs.png``, stop the gateway."""
    gateway = Gateway(GatewayConfig(UNUSED_COORDINATOR, port=0, status_interval_s=60))
    sock = gateway.bind()
    gateway.port = int(sock.getsockname()[1])
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(gateway.run(sock))
        try:
            url = f"{gateway.url}/docs"
            return await asyncio.to_thread(chromium_screenshot, url, out / "gateway-docs.png", browser)
        finally:
            gateway.stop()
            await serving


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m styx_py.benchmarks.screenshots", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("docs/img"), help="folder of the PNGs (docs/img)")
    p.add_argument("--browser", help="the Chromium binary (default: chromium on the PATH)")
    args = p.parse_args(argv)
    browser = args.browser or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("screenshots: error: no Chromium on the PATH (apt-get install chromium)")
        return 2
    try:
        print(asyncio.run(gateway_docs(args.out, browser)))
    except StyxError as exc:
        print(f"screenshots: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
