"""Helper processes die with their parent: killing a coordinator (SIGKILL, no closers run) or whatever
started a local stack leaves no process behind (styx_py.io.lifeline)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from styx_client import StyxClient
from styx_py.core.wire import StatusRequest
from styx_py.io import lifeline
from styx_py.stack.local import admin
from styx_py.stack.services import SeaweedS3, TansuBroker
from tests.service_fixtures import ClusterFactory
from tests.test_restarts import open_accounts, transfers

Process = tuple[int, int]  # pid and start time (clock ticks since boot): a reused pid is another process


def _stat(pid: int) -> tuple[str, int, int] | None:
    """State, parent pid and start time of ``pid`` from /proc (None: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _tree(root: int) -> set[Process]:
    """``root`` and every live process whose parent chain leads to it."""
    children: dict[int, list[Process]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append((int(entry), stat[2]))
    top = _stat(root)
    out: set[Process] = set() if top is None else {(root, top[2])}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child[0])
    return out


def _alive(process: Process) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[0] != "Z" and stat[2] == process[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "<gone>"


def _wait_gone(processes: set[Process], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the processes' exit, bounded by the deadline
    assert not left, f"{what}: still running: " + "; ".join(f"{p[0]} {_cmdline(p[0])}" for p in left)


@pytest.mark.services
async def test_killing_the_coordinator_leaves_none_of_its_children(
    local_cluster: ClusterFactory, s3: SeaweedS3
) -> None:
    """The coordinator's compaction child (a multiprocessing spawn pool) and multiprocessing's
    resource tracker end when the coordinator is SIGKILLed."""
    settings = {"snapshot_interval_s": "0.2", "snapshot_compact_after": "1"}
    stack = await asyncio.to_thread(local_cluster, s3=s3, app="styx_benchmarks.bank:app", settings=settings)
    coordinator = stack.procs["coordinator"]

    def helpers() -> list[str]:
        return [c for pid, _ in _tree(coordinator.pid) if "multiprocessing" in (c := _cmdline(pid))]

    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        await open_accounts(client)
        seed, deadline = 0, time.monotonic() + 120
        while len(helpers()) < 2:  # the snapshots that follow compact, in the child
            status = await admin(stack.coordinator, StatusRequest(), secret=stack.secret)
            assert time.monotonic() < deadline, f"no compaction child: {status['compactions']} compactions"
            await transfers(client, 50, seed)
            seed += 1
    tree = _tree(coordinator.pid)
    commands = helpers()
    assert any("multiprocessing.spawn" in c for c in commands), commands  # the compaction child
    assert any("multiprocessing.resource_tracker" in c for c in commands), commands
    coordinator.kill()
    coordinator.wait()
    _wait_gone(tree, "after the coordinator was SIGKILLed")


def test_a_child_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """``lifeline.popen`` from the main thread and from a thread that has ended since: the child (a
    sleeping ``sleep``, which knows nothing of its parent) is killed when the parent process dies."""
    script = (
        "import subprocess, sys, threading\n"
        "from styx_py.io import lifeline\n"
        "kids = [lifeline.popen(['sleep', '600'])]\n"
        "t = threading.Thread(target=lambda: kids.append(lifeline.popen(['sleep', '600'])))\n"
        "t.start(); t.join()\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, pids
        kids = set()
        for pid in pids:
            stat = _stat(pid)
            assert stat is not None and stat[1] == parent.pid, (pid, stat)
            kids.add((pid, stat[2]))
        # The thread that started the second child has ended: the child must still run.
        assert all(_alive(k) for k in kids)
        parent.kill()
        parent.wait()
        _wait_gone(kids, "after their parent was SIGKILLed")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_whose_parent_died_before_it_was_armed_ends_itself() -> None:
    """The race the pid check closes: a parent that died between the fork and the prctl leaves the
    child with another parent, and ``arm`` ends the child instead of letting it run on."""
    done = subprocess.run(
        [sys.executable, "-c", f"from styx_py.io import lifeline; lifeline.arm({os.getpid() + 10**7})"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
    assert lifeline.supported()


@pytest.mark.services
def test_a_killed_stack_owner_leaves_no_service(tmp_path: Path, kafka: TansuBroker) -> None:
    """A process running a local stack (S3, broker, coordinator, workers, gateway) is SIGKILLed, so
    none of its cleanup runs: every service it started ends anyway."""
    del kafka  # the session's broker is not used: the stack starts its own, which must end too
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from styx_py.stack.local import LocalStack\n"
        "stack = LocalStack(Path(sys.argv[1]), workers=1, gateway=True).start()\n"
        "print('up', flush=True)\n"
        "sys.stdin.read()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "up"
        tree = _tree(owner.pid)
        commands = [_cmdline(pid) for pid, _ in tree]
        for service in ("weed", "tansu", "coordinator", "worker", "gateway"):
            assert any(service in c for c in commands), (service, commands)
        owner.kill()
        owner.wait()
        _wait_gone(tree, "after the stack's owner was SIGKILLed")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_stack_ends_what_an_earlier_one_on_its_directory_left_running(tmp_path: Path) -> None:
    """The pid records in a stack's data directory: a process an owner that is gone left running (a
    service in its own session, not tied to its parent) is ended by the next stack on the directory;
    one whose owner still runs, and a recorded pid that is now another process, are left alone."""
    from styx_py.stack import pidfile

    script = (
        "import subprocess, sys\n"
        "from pathlib import Path\n"
        "from styx_py.stack import pidfile\n"
        "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
        "kid = subprocess.Popen(['sleep', '600'], start_new_session=True, **quiet)\n"
        "pidfile.record(Path(sys.argv[1]), 'sleeper', kid.pid)\n"
        "print(kid.pid, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    orphan = int(done.stdout)  # its owner has exited: it runs with another parent
    started = pidfile.start_time(orphan)
    assert started is not None
    ours = lifeline.popen(["sleep", "600"], start_new_session=True)  # recorded by a running owner: this one
    try:
        pidfile.record(tmp_path, "ours", ours.pid)
        with (tmp_path / pidfile.PIDS_FILE).open("a") as f:  # a pid that is now another process
            f.write(f"{ours.pid} {(pidfile.start_time(ours.pid) or 0) + 1} 1 0 reused\n")
        assert pidfile.reap(tmp_path) == [
            f"sleeper (pid {orphan}) left by an earlier stack on {tmp_path}: stopped"
        ]
        _wait_gone({(orphan, started)}, "after the reap")
        assert ours.poll() is None, "a process of a running owner was ended"
        assert not (tmp_path / pidfile.PIDS_FILE).exists()
        assert pidfile.reap(tmp_path) == []
    finally:
        ours.kill()
        ours.wait()
        if pidfile.start_time(orphan) == started:
            os.kill(orphan, signal.SIGKILL)
