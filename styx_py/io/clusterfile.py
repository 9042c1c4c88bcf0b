"""The file ``styx up`` leaves for the commands run beside it: ``.styx/cluster.json`` (owner-only).

It holds what a client of the local cluster needs, as ``STYX_*`` settings (``env``: the coordinator,
Kafka, the gateway URL, the S3 endpoint and keys, the cluster secret), the endpoints to show a person
(``endpoints``), the log directory and the pid of the ``styx up`` that owns it. ``styx
status/deploy/call/invocations/gateway/audit`` run in that directory read it; the environment and
command-line options take precedence. ``styx env`` prints it as ``export`` lines. The SDK's
``StyxClient.connect()`` without an address uses :func:`default_coordinator` and
:func:`default_secret` too.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from styx_py.core.errors import StyxError
from styx_py.io.handshake import SECRET_ENV

__all__ = [
    "SECRET_SETTINGS",
    "STATE_FILE",
    "ClusterFile",
    "default_coordinator",
    "default_secret",
    "export_lines",
    "read_cluster_file",
]

STATE_FILE = Path(".styx") / "cluster.json"
FORMAT_VERSION = 1

# Never printed by `styx up`: it lets its holder deploy code, call any function and read any state.
SECRET_SETTINGS = frozenset({SECRET_ENV})


@dataclass(frozen=True, slots=True)
class ClusterFile:
    env: dict[str, str]
    endpoints: dict[str, str] = field(default_factory=dict)
    logs: str = ""
    pid: int = 0

    @property
    def coordinator(self) -> str:
        return self.env["STYX_COORDINATOR"]

    def write(self, path: Path = STATE_FILE) -> None:
        """Write ``path`` readable by the owner only (it holds the cluster secret and the S3 keys)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "version": FORMAT_VERSION,
            "pid": self.pid,
            "env": self.env,
            "endpoints": self.endpoints,
            "logs": self.logs,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(body, out, indent=2)
            out.write("\n")


def read_cluster_file(path: Path = STATE_FILE) -> ClusterFile | None:
    """The file ``styx up`` left at ``path``, or None when there is none."""
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StyxError(f"cannot read {path} (left by 'styx up'): {exc}; delete it or run 'styx up'") from exc
    if (
        not isinstance(body, dict)
        or body.get("version") != FORMAT_VERSION
        or "STYX_COORDINATOR" not in (body.get("env") or {})
    ):
        raise StyxError(f"{path} is not a cluster file of this styx version; delete it or run 'styx up'")
    pid = int(body.get("pid", 0))
    if pid and not _alive(pid):
        raise StyxError(
            f"{path} was left by a 'styx up' (pid {pid}) that is no longer running; "
            "delete it or run 'styx up'"
        )
    return ClusterFile(
        env={str(k): str(v) for k, v in body["env"].items()},
        endpoints={str(k): str(v) for k, v in (body.get("endpoints") or {}).items()},
        logs=str(body.get("logs", "")),
        pid=pid,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def export_lines(env: Mapping[str, str], *, secrets: bool, path: Path = STATE_FILE) -> list[str]:
    """``export NAME=value`` lines for a POSIX shell (values quoted); without ``secrets`` the
    :data:`SECRET_SETTINGS` become a comment saying where they are."""
    lines: list[str] = []
    for name, value in env.items():
        if name in SECRET_SETTINGS and not secrets:
            lines.append(f"# {name}: in {path} (owner-only); 'eval \"$(styx env)\"' exports it too")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def default_coordinator() -> str | None:
    """``$STYX_COORDINATOR``, else the coordinator of the cluster file in this directory, else None."""
    env = os.environ.get("STYX_COORDINATOR")
    if env:
        return env
    state = read_cluster_file()
    return None if state is None else state.coordinator


def default_secret(address: str) -> str | None:
    """``$STYX_CLUSTER_SECRET``, else the cluster file's secret when ``address`` is its coordinator,
    else None. A stale file holds no secret for a live cluster: None (the connection says what fails)."""
    env = os.environ.get(SECRET_ENV)
    if env is not None:
        return env
    try:
        state = read_cluster_file()
    except StyxError:
        return None
    if state is not None and state.coordinator == address:
        return state.env.get(SECRET_ENV, "")
    return None
