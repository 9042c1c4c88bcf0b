"""The managed subprocess every local service is: its own process group, output appended to a log
file (whose tail goes into every start-up error), readiness polled with a deadline, and stopped at
interpreter exit if its owner did not stop it."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Self, TypeVar

from styx_py.core.limits import SERVICE_START_TIMEOUT_S
from styx_py.io import lifeline
from styx_py.stack.errors import ServiceError
from styx_py.stack.net import can_bind

__all__ = ["SERVICE_START_TIMEOUT_S", "ManagedProcess", "poll_until"]

_POLL_INTERVAL_S = 0.05
_LOG_TAIL_LINES = 40

_live: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop services we started if the interpreter exits without stopping them.

    They run in their own session (so Ctrl+C in a terminal does not kill them mid-test and
    so we can signal the whole group), which also means they would outlive us.
    """
    for service in list(_live):
        service.stop(timeout_s=2.0)


def _tail(path: Path, start: int, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    text = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


_T = TypeVar("_T")


class ManagedProcess:
    """A subprocess in its own process group, with its output appended to a log file."""

    name = "service"

    def __init__(self, log_path: Path | None) -> None:
        self._own_log = log_path is None
        if log_path is None:
            fd, tmp = tempfile.mkstemp(prefix=f"styx-{self.name}-", suffix=".log")
            os.close(fd)
            log_path = Path(tmp)
        self.log_path: Path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._last_exit_code: int | None = None
        self._log_fh: IO[bytes] | None = None
        self._log_start = 0
        self.startup_seconds: float | None = None
        """Wall time of the last successful start() (launch to ready), for diagnostics."""

    # -- subclass hooks
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    def _after_exit(self) -> None:
        """The process ended: remove what it leaves behind outside its own directories."""

    def _wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    def _listen_ports(self) -> list[int]:
        """Every port the service will listen on (checked for squatters before launch)."""
        raise NotImplementedError

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        """Launch the service and return once it serves (a real operation succeeded)."""
        raise NotImplementedError

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """How the last run ended (a negative number: the signal that killed it); None while it runs
        or before it ever ran."""
        return self._proc.poll() if self._proc is not None else self._last_exit_code

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _launch(self, timeout_s: float) -> None:
        if self._proc is not None:
            raise ServiceError(f"{self.name} already started (pid {self._proc.pid})")
        # Readiness probes talk to a port, not to a pid: if something else already listens
        # there (another run, or a port taken while we were stopped for restart()), the
        # probe would succeed against *that* server. Refuse instead.
        busy = [port for port in self._listen_ports() if not can_bind(port, reuse_addr=True)]
        if busy:
            raise ServiceError(f"cannot start {self.name}: port(s) {busy} on 127.0.0.1 already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = self.log_path.open("ab")
        self._log_start = log_fh.tell()
        began = time.monotonic()
        try:
            self._proc = lifeline.popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        except OSError as exc:
            log_fh.close()
            raise ServiceError(f"could not launch {self.name}: {exc}") from exc
        self._log_fh = log_fh
        _live.add(self)
        try:
            self._wait_ready(began + timeout_s)
            self._check_alive()
        except BaseException:
            self._terminate(timeout_s=2.0)
            raise
        self.startup_seconds = time.monotonic() - began

    def _check_alive(self) -> None:
        """Raise at once, with the log, if the process has already exited."""
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise ServiceError(
                f"{self.name} exited with code {code} during start-up; "
                f"log {self.log_path}:\n{self.log_tail()}"
            )

    def _timeout_error(self, what: str, last_error: BaseException | None) -> ServiceError:
        return ServiceError(
            f"{self.name} not ready within the deadline ({what}); last error: "
            f"{last_error!r}; log {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines the current (or last) run wrote to its log."""
        if self._log_fh is not None:
            self._log_fh.flush()
        return _tail(self.log_path, self._log_start, lines)

    def _terminate(self, timeout_s: float, sig: int = signal.SIGTERM) -> None:
        proc = self._proc
        if proc is None:
            return
        # Only signal the group while its leader is unreaped: after that the id could be
        # reused by an unrelated process. Both binaries are single processes.
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._last_exit_code = proc.returncode
        self._proc = None
        _live.discard(self)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        self._after_exit()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``. Safe to call twice."""
        self._terminate(timeout_s)
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the process group at once: simulates a crash (e.g. for durability tests)."""
        self._terminate(timeout_s=5.0, sig=signal.SIGKILL)

    def restart(self, timeout_s: float = SERVICE_START_TIMEOUT_S, *, hard: bool = False) -> Self:
        """Stop (SIGTERM, or SIGKILL with ``hard``) and start again: on the same ports, so clients
        keep their addresses (and, where the service stores data on disk, with the same data)."""
        if hard:
            self.kill()
        else:
            self._terminate(timeout_s=5.0)
        return self.start(timeout_s)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # Best effort only: explicit stop() / the context manager is the contract.
        if getattr(self, "_proc", None) is not None:
            self._terminate(timeout_s=2.0)


def poll_until(
    attempt: Callable[[], _T],
    *,
    deadline: float,
    transient: tuple[type[BaseException], ...],
    check_alive: Callable[[], None],
    on_timeout: Callable[[BaseException | None], ServiceError],
) -> _T:
    """Call ``attempt`` until it returns, retrying only the ``transient`` errors."""
    last_error: BaseException | None = None
    while True:
        check_alive()
        try:
            return attempt()
        except transient as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise on_timeout(last_error)
        time.sleep(_POLL_INTERVAL_S)
