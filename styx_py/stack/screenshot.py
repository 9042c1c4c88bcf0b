"""Screenshots of web pages (an audit report, the gateway's ``/docs``) with headless Chromium.

Debian's ``chromium`` package; each shot runs a fresh browser with a throw-away profile, no network
beyond the page it is given (no component updates, sync, QUIC or background fetches), so it works
offline and leaves nothing behind::

    python -m styx_py.stack.screenshot OUT/report.html docs/img/audit-report.png --window-size 1280,2400
    python -m styx_py.stack.screenshot http://127.0.0.1:8080/docs docs/img/gateway-docs.png

A page is a file path (shown as a ``file://`` URL) or an ``http(s)://`` URL. Chromium's
``--screenshot`` captures the window, so ``--window-size`` sets how much of a long page is shown.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from styx_py.core.errors import StyxError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root in containers; the page is our own report
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",  # ms of page time for its scripts (Swagger UI fetches the schema)
)
DEFAULT_WINDOW = (1280, 2400)
TIMEOUT_S = 120.0  # a first start of Chromium on a busy 2-core machine takes a few seconds


class ScreenshotError(StyxError):
    """Chromium is missing, failed, or wrote no image."""


def find_browser() -> str | None:
    """The path of a Chromium (``chromium`` first, as Debian names it), or None."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def page_url(page: str | Path) -> str:
    text = str(page)
    if text.startswith(("http://", "https://", "file://", "data:")):
        return text
    path = Path(page).resolve()
    if not path.exists():
        raise ScreenshotError(f"no page at {path}")
    return path.as_uri()


def command(browser: str, url: str, png: Path, profile: Path, window: tuple[int, int]) -> list[str]:
    """The Chromium command line of one screenshot."""
    return [*_base(browser, profile, window), f"--screenshot={png}", url]


def _base(browser: str, profile: Path, window: tuple[int, int]) -> list[str]:
    return [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}"]


def _browser(browser: str | None) -> str:
    found = browser or find_browser()
    if found is None:
        raise ScreenshotError(f"no Chromium found (tried {', '.join(BROWSERS)}): apt-get install chromium")
    return found


def _run(args: list[str], url: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ScreenshotError(f"Chromium took more than {timeout_s:g}s to render {url}") from exc


def screenshot(
    page: str | Path,
    png: Path,
    window: tuple[int, int] = DEFAULT_WINDOW,
    browser: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Path:
    """Render ``page`` (a file or a URL) to ``png`` in a ``window``-sized headless Chromium window."""
    browser = _browser(browser)
    url = page_url(page)
    png = png.resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="styx-chromium-") as profile:
        done = _run(command(browser, url, png, Path(profile), window), url, timeout_s)
    if done.returncode != 0 or not png.exists() or png.stat().st_size == 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise ScreenshotError(f"Chromium wrote no screenshot of {url} (exit {done.returncode}): {tail}")
    return png


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.partition(",")
    return int(width), int(height)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m styx_py.stack.screenshot", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("page", help="an HTML file or an http(s):// URL")
    p.add_argument("png", type=Path, help="where to write the PNG")
    p.add_argument(
        "--window-size", type=_size, default=DEFAULT_WINDOW, help="WIDTH,HEIGHT in pixels (default 1280,2400)"
    )
    p.add_argument("--browser", help="the Chromium binary (default: chromium on the PATH)")
    args = p.parse_args(argv)
    try:
        print(screenshot(args.page, args.png, args.window_size, args.browser))
    except ScreenshotError as exc:
        print(f"screenshot: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
