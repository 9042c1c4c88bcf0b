"""Helper processes die with the process that started them, even when it is SIGKILLed.

A process that dies without running its closers (SIGKILL, the OOM killer, a segfault) cannot stop its
children; they would run on with parent 1: the coordinator's compaction child, the services a local
stack started. On Linux each child asks the kernel for a SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, :func:`arm`), and then checks that its parent is still the process
that started it: one that died between the fork and the ``prctl`` has already handed the child to
another parent, and the child ends itself.

The kernel sends that signal when the *thread* that forked the child ends, not the process, so
:func:`popen` forks from the main thread or, when called from another thread (``asyncio.to_thread``, a
supervisor thread), from one thread kept for the life of the process.

Elsewhere (not Linux) :func:`arm` does nothing: children are stopped by their parent's closers only.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["arm", "popen", "supported"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    _libc = ctypes.CDLL(None, use_errno=True)


def supported() -> bool:
    """Whether children can be tied to their parent here (Linux)."""
    return _libc is not None


def arm(parent_pid: int) -> None:
    """In a child of ``parent_pid``: be SIGKILLed when the parent dies; if it has died already (the
    child's parent is another process now), SIGKILL this process at once.

    Runs between fork and exec (``preexec_fn``) or first thing in a child (an initializer): two
    system calls, through a library loaded before the fork.
    """
    if _libc is None:
        return
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


# ---- starting children ---------------------------------------------------------------------------------

_jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_keeper: threading.Thread | None = None
_keeper_lock = threading.Lock()


def _keep() -> None:
    while True:
        job, done = _jobs.get()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - the caller raises it (Future.result)
                done.set_exception(exc)


def _in_lasting_thread(job: Callable[[], Any]) -> Any:
    """``job()`` in the main thread, or in the one daemon thread that lives as long as the process."""
    global _keeper
    if threading.current_thread() is threading.main_thread():
        return job()
    with _keeper_lock:
        if _keeper is None:
            _keeper = threading.Thread(target=_keep, name="styx-lifeline", daemon=True)
            _keeper.start()
    done: Future[Any] = Future()
    _jobs.put((job, done))
    return done.result()


def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """:class:`subprocess.Popen` (the same arguments, but no ``preexec_fn``) of a child that is
    SIGKILLed when this process dies (:func:`arm`)."""
    if "preexec_fn" in kwargs:
        raise TypeError("lifeline.popen sets preexec_fn itself")
    parent = os.getpid()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, preexec_fn=lambda: arm(parent), **kwargs)

    proc: subprocess.Popen[bytes] = _in_lasting_thread(start)
    return proc
