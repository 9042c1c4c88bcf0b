"""Headless Chromium driven over the DevTools protocol, for tests that click through a page.

Chromium's ``--remote-debugging-pipe`` speaks the protocol over two pipes (fd 3: commands in, fd 4:
replies and events out, each message JSON ended by a NUL byte), so no WebSocket client is needed.
One page, one session (``Target.attachToTarget`` with ``flatten``); a fresh profile, and the same
no-network flags as the screenshots (:data:`styx_py.stack.screenshot.FLAGS`, less the virtual time
budget: here the test waits for what it needs, polling the page with a deadline).

    with Browser(find_browser()) as page:
        page.goto(url)
        page.wait("tr[data-worker]")
        page.click("#to-invocations")
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any, Self

from styx_py.stack.screenshot import FLAGS

__all__ = ["Browser"]

WAIT_S = 30.0  # for an element to appear (a busy 2-core machine renders slowly)
POLL_S = 0.05


class Browser:
    """A headless Chromium with one page."""

    def __init__(self, binary: str, window: tuple[int, int] = (1280, 900)) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="styx-cdp-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        flags = [f for f in FLAGS if not f.startswith("--virtual-time-budget")]

        def pipes() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes to us
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self._proc = subprocess.Popen(
            [binary, *flags, "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             f"--window-size={window[0]},{window[1]}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Python's descriptors are close-on-exec; the two dup2'd into 3 and 4 are not, and
            # close_fds would close them after preexec_fn has made them.
            preexec_fn=pipes, close_fds=False, start_new_session=True,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)[
            "sessionId"
        ]
        self.send("Page.enable")

    # ---- the protocol ------------------------------------------------------------------------------------
    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One command; its result (events that come before it are dropped: nothing here needs them)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                raise AssertionError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    # ---- what a test does ---------------------------------------------------------------------------------
    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait(self, selector: str, text: str | None = None, timeout_s: float = WAIT_S) -> None:
        """Until an element matches ``selector`` (and, with ``text``, its text contains it)."""
        probe = f"document.querySelector({json.dumps(selector)})"
        check = (
            f"!!{probe}" if text is None else f"!!{probe} && {probe}.textContent.includes({json.dumps(text)})"
        )
        self.until(check, f"{selector!r}{f' with {text!r}' if text else ''}", timeout_s)

    def until(self, expression: str, what: str, timeout_s: float = WAIT_S) -> None:
        """Until the JavaScript ``expression`` is true in the page (polled, with a deadline)."""
        deadline = time.monotonic() + timeout_s
        while not self.eval(expression):
            if time.monotonic() > deadline:
                body = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''")
                raise AssertionError(f"no {what} on the page:\n{body}")
            time.sleep(POLL_S)

    def text(self, selector: str) -> str:
        return str(self.eval(f"document.querySelector({json.dumps(selector)}).textContent"))

    def attr(self, selector: str, name: str) -> str | None:
        value = self.eval(f"document.querySelector({json.dumps(selector)}).getAttribute({json.dumps(name)})")
        return None if value is None else str(value)

    def click(self, selector: str) -> None:
        """A mouse click (press and release) at the middle of the element, scrolled into view."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def select(self, selector: str, value: str) -> None:
        """Choose ``value`` in a ``<select>`` as a user would (the change event fires)."""
        self.eval(
            f"(() => {{ const s = document.querySelector({json.dumps(selector)});"
            f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()"
        )

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._proc.poll() is None:  # the browser and its helpers: the process group it leads
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        self._profile.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
