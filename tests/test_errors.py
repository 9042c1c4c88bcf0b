"""Errors: bugs end the process, operating errors are named, and the tree is drawn as it is.

Pins down: no handler in ``worker/`` or ``coordinator/`` catches ``Exception`` or ``BaseException``
and carries on (the one that runs user code excepted); the exception tree drawn in
:mod:`styx_py.core.errors` names every ``StyxError`` subclass and internal control signal, each under
its base; a task that raises ends ``run_until_failure`` with exit code 70 after logging it CRITICAL
(a StyxError it let through is raised as itself);
the local stack's supervisor restarts a process that exited with an error and says how it ended.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from styx_py.core import errors
from styx_py.io.serving import run_until_failure
from styx_py.io.tcp import EXIT_HANDLER_FAILED, TcpTransport
from styx_py.stack.local import LocalStack
from styx_py.stack.net import free_port

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["styx_py", "worker/styx_worker", "coordinator/styx_coordinator", "client/styx_client"]
PACKAGES += ["benchmarks/styx_benchmarks"]

# The sites that must catch every exception and carry on, by (file, enclosing function): why.
MAY_CATCH_EVERYTHING = {
    ("worker/styx_worker/executor.py", "run_invocation"): (
        "runs user code: any exception a function raises aborts its transaction (the client gets it)"
    ),
    ("worker/styx_worker/runner.py", "_drain"): (
        "an invocation's first step runs in a loop callback, which cannot raise into the worker's task "
        "group: what it raises is raised again inside a task of that group"
    ),
    ("worker/styx_worker/runner.py", "__await__"): (
        "relays what is thrown into a suspended invocation to its coroutine, as `yield from` does"
    ),
    ("worker/styx_worker/outbox.py", "_attempts"): (
        "runs an external service's client (application code): whatever it raises is a failed attempt, "
        "and after the bounded attempts the call's outcome, which its continuation gets"
    ),
    ("worker/styx_worker/shell.py", "_guarded"): (
        "a log acknowledgement is handled in a future's callback, which cannot raise into the worker's "
        "task group: what it raises is raised again inside a task of that group"
    ),
}


# ---- no blind except that carries on ------------------------------------------------------------------


def _blind(handler: ast.ExceptHandler) -> bool:
    """``except:``, ``except Exception``, ``except BaseException`` (alone or in a tuple)."""
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("Exception", "BaseException") for n in names)


def blind_handlers_that_carry_on(folder: str) -> list[str]:
    """``path:line in function`` of every blind handler under ``folder`` whose body does not end in
    ``raise``, less :data:`MAY_CATCH_EVERYTHING`."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for function, handler in _handlers(tree):
            carries_on = _blind(handler) and not isinstance(handler.body[-1], ast.Raise)
            if carries_on and (rel, function) not in MAY_CATCH_EVERYTHING:
                found.append(f"{rel}:{handler.lineno} in {function}")
    return found


def _handlers(tree: ast.AST) -> list[tuple[str, ast.ExceptHandler]]:
    """Every except handler with the name of the function (or module) it is in."""
    out: list[tuple[str, ast.ExceptHandler]] = []

    def walk(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                walk(child, child.name)
            else:
                if isinstance(child, ast.ExceptHandler):
                    out.append((function, child))
                walk(child, function)

    walk(tree, "<module>")
    return out


@pytest.mark.parametrize(
    "folder",
    [
        "coordinator/styx_coordinator",
        "worker/styx_worker",
    ],
)
def test_no_handler_catches_every_exception_and_carries_on(folder: str) -> None:
    """A bug (an assertion, a TypeError) must end the process, never be logged and retried: catch the
    named operating errors that can happen there, or re-raise."""
    found = blind_handlers_that_carry_on(folder)
    assert not found, "catch the named errors instead (or re-raise): " + ", ".join(found)


def test_the_guard_sees_what_it_must() -> None:
    """The scan itself: a blind handler that logs and carries on is found; one that re-raises, one
    that names its errors, and the allowed user-code site are not."""
    source = """
def bad():
    try:
        f()
    except Exception as exc:
        log(exc)

def re_raises():
    try:
        f()
    except BaseException:
        cleanup()
        raise

def named():
    try:
        f()
    except (OSError, KeyError):
        pass

async def also_bad():
    try:
        f()
    except (ValueError, Exception):
        pass
    try:
        g()
    except:
        pass
"""
    handlers = _handlers(ast.parse(source))
    flagged = [function for function, h in handlers if _blind(h) and not isinstance(h.body[-1], ast.Raise)]
    assert flagged == ["bad", "also_bad", "also_bad"]
    executor = ROOT / "worker/styx_worker/executor.py"
    sites = [f for f, h in _handlers(ast.parse(executor.read_text())) if _blind(h)]
    assert "run_invocation" in sites, "the allowed site moved: update MAY_CATCH_EVERYTHING"


# ---- the exception tree --------------------------------------------------------------------------------


def drawn_tree() -> dict[str, str]:
    """Class -> base, as the docstring of styx_py.core.errors draws them."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n\n", 1)[0]
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        # A root at the fourth column, or a name after a branch (a description's next line is neither).
        m = re.match(r"^ {4}(?:((?:[│ ] {3})*)[├└]── )?(\w+)(?:\((\w+)\))?(?:\s|$)", line)
        if m is None:
            continue
        depth, name = (-1 if m.group(1) is None else len(m.group(1))), m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if m.group(3):
            parents[name] = m.group(3)
        elif stack:
            parents[name] = stack[-1][1]
        else:
            parents[name] = ""  # a root
        stack.append((depth, name))
    return parents


def coded_tree() -> dict[str, str]:
    """Class -> base, of every exception in the packages that derives from StyxError, straight from
    Abort, or straight from BaseException (the internal control signals), by an AST scan of the
    sources."""
    classes: list[tuple[str, list[str]]] = []
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                    classes.append((node.name, bases))

    def styx(name: str) -> bool:
        return name == "StyxError" or any(styx(b) for n, bases in classes if n == name for b in bases)

    out: dict[str, str] = {}
    for name, bases in classes:
        if name != "StyxError" and styx(name):
            base = next(b for b in bases if styx(b))  # the base it is drawn under
        elif bases == ["BaseException"]:
            base = "BaseException"
        elif bases == ["Abort"]:  # an abort with a name of its own (PendingLimit)
            base = "Abort"
        else:
            continue
        assert out.setdefault(name, base) == base, f"two exceptions named {name}"
    return out


def test_the_drawn_exception_tree_is_the_code() -> None:
    drawn, coded = drawn_tree(), coded_tree()
    assert drawn.pop("StyxError") == "" and drawn.pop("BaseException") == ""
    assert drawn.pop("Abort") == "Exception" and issubclass(errors.Abort, Exception)
    assert drawn.pop("ScanLimitExceeded") == "ValueError" and issubclass(errors.ScanLimitExceeded, ValueError)
    assert drawn == coded, "draw the exception tree as the code has it (styx_py/core/errors.py)"


def test_a_backend_error_is_an_operating_error_and_an_os_error() -> None:
    exc = errors.BackendError("S3 put x failed: S3Error: AccessDenied")
    assert isinstance(exc, errors.StyxError) and isinstance(exc, OSError)
    assert str(exc) == "S3 put x failed: S3Error: AccessDenied"


# ---- a task that raises ends the process -----------------------------------------------------------


async def test_a_task_that_raises_ends_the_process_with_exit_code_70(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = TcpTransport("w1", lambda src, msg: None, inbox="worker", secret="")
    await transport.start()
    closed: list[str] = []

    async def bug() -> None:
        await asyncio.sleep(0)
        raise AssertionError("a bug in a task")

    async def close() -> None:
        closed.append("closed")

    with pytest.raises(SystemExit) as ended:
        await run_until_failure(transport, [bug(), asyncio.Event().wait()], [close])
    assert ended.value.code == EXIT_HANDLER_FAILED
    assert closed == ["closed"], "the closers run first"
    [record] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert record.exc_info is not None and "a bug in a task" in repr(record.exc_info[1])


async def test_an_operating_error_a_task_let_through_ends_the_process_as_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A StyxError (a refused ``--deploy`` at start-up) is no bug: it is raised as it is, for the
    command line to print in one line, not as exit code 70."""
    transport = TcpTransport("coordinator", lambda src, msg: None, inbox="coordinator", secret="")
    await transport.start()
    closed: list[str] = []

    async def refused() -> None:
        await asyncio.sleep(0)
        raise errors.GraphError("cannot import 'nothere'")

    async def close() -> None:
        closed.append("closed")

    with pytest.raises(errors.GraphError, match="cannot import 'nothere'"):
        await run_until_failure(transport, [refused(), asyncio.Event().wait()], [close])
    assert closed == ["closed"]
    assert not [r for r in caplog.records if r.levelno == logging.CRITICAL]


# ---- the supervisor restarts what exited -------------------------------------------------------------


def test_the_supervisor_restarts_a_process_that_exited_with_an_error(tmp_path: Path) -> None:
    """``styx up`` supervises its processes as Kubernetes would: one that exited with an error (70: a
    bug) is started again, and the operator is told how it ended."""
    stack = LocalStack(tmp_path, workers=1)
    stack.coordinator, stack.kafka = f"127.0.0.1:{free_port()}", "127.0.0.1:1"  # nothing listens
    stack.log_dir.mkdir(parents=True)
    crashed = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({EXIT_HANDLER_FAILED})"])
    assert crashed.wait(60) == EXIT_HANDLER_FAILED
    stack.procs["w1"] = crashed
    try:
        said = stack.supervise()
        restarted = stack.procs["w1"]
        assert restarted is not crashed
        assert restarted.args[-6:-4] == ["--id", "w1"] and "worker" in restarted.args
    finally:
        stack.stop()
    assert said == [
        "w1 exited with code 70 (a bug: its log has the traceback): restarted (the cluster recovers)"
    ]
