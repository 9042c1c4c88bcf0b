"""A whole local cluster on loopback: SeaweedFS (S3), Tansu (Kafka protocol), coordinator, workers.

Used by ``styx up`` and by the integration tests. Every part is a real process; readiness is a real
operation (an authenticated S3 PUT, a CreateTopics, every worker registered with the coordinator),
never a sleep. Ports are free ones unless :class:`StackPorts` asks for stable ones (``styx up`` does:
:data:`DEFAULT_PORTS`); a stable port that is taken falls back to a free one, listed in
:attr:`LocalStack.port_notes`. The coordinator and every worker also serve Prometheus metrics
(``STYX_METRICS_PORT``), kept across restarts; :meth:`LocalStack.endpoints` lists them.

Every process of a stack shares one cluster secret (``STYX_CLUSTER_SECRET``): the one in ``env`` or the
environment, else a fresh random one. The process that starts the stack is its client: the secret is
put in its environment (when unset there), so its SDK and CLI calls, and the ``styx`` commands it runs,
authenticate; ``styx up`` also leaves it, with the endpoints and the S3 keys, in ``.styx/cluster.json``
(readable by the owner only; :mod:`styx_py.io.clusterfile`). The local S3 gets fresh random keys
per stack unless ``STYX_S3_ACCESS_KEY``/``STYX_S3_SECRET_KEY`` are set.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from styx_py.core.errors import EXIT_HANDLER_FAILED, StyxError
from styx_py.core.limits import WORKER_RESTART_GRACE_S
from styx_py.core.wire import AdminReply, DeployRequest, StatusRequest, ToCoordinator
from styx_py.core.words import counted
from styx_py.io import lifeline
from styx_py.io.admin import admin_request
from styx_py.io.clusterfile import STATE_FILE, default_coordinator, default_secret
from styx_py.io.handshake import SECRET_ENV
from styx_py.stack import pidfile
from styx_py.stack.errors import BrokerLost, ServiceError
from styx_py.stack.net import DEFAULT_PORTS, StackPorts, preferred_port

if TYPE_CHECKING:  # imported by start(): `styx deploy|status|call` use this module without the [local] extra
    from styx_py.stack.seaweed import S3Config, SeaweedS3
    from styx_py.stack.tansu import TansuBroker

__all__ = [
    "DEFAULT_PORTS",
    "STATE_FILE",
    "LocalStack",
    "StackPorts",
    "admin",
    "cluster_secret",
    "coordinator_address",
]


def coordinator_address(explicit: str | None) -> str:
    """``--coordinator``, else ``STYX_COORDINATOR``, else the address ``styx up`` left in .styx/."""
    address = explicit or default_coordinator()
    if address:
        return address
    raise StyxError(
        "no coordinator address: pass --coordinator HOST:PORT, set STYX_COORDINATOR or run 'styx up'"
    )


def cluster_secret(address: str) -> str:
    """``STYX_CLUSTER_SECRET``, else the secret ``styx up`` left in .styx/ for the cluster at ``address``,
    else empty (a loopback cluster without a secret)."""
    return default_secret(address) or ""


async def admin(
    address: str, msg: ToCoordinator, timeout_s: float = 60.0, secret: str | None = None
) -> dict[str, Any]:
    """One admin request; ``secret`` defaults to :func:`cluster_secret`."""
    secret = cluster_secret(address) if secret is None else secret
    try:
        reply: AdminReply = await admin_request(address, msg, timeout_s, secret=secret)
    except TimeoutError:
        raise StyxError(f"no answer from the coordinator at {address} within {timeout_s:g} s") from None
    except OSError as exc:
        raise StyxError(f"cannot reach the coordinator at {address}: {exc}") from exc
    if not reply.ok:
        raise StyxError(reply.error)
    return reply.body


def _ended(code: int) -> str:
    """How a process ended, for the operator: its exit code (70: a bug, its log has the traceback) or
    the signal that killed it."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}" + (
        " (a bug: its log has the traceback)" if code == EXIT_HANDLER_FAILED else ""
    )


class LocalStack:
    def __init__(
        self,
        data_dir: Path,
        *,
        workers: int = 2,
        durable: bool = False,
        kafka: str | None = None,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        gateway: bool = False,
        gateway_args: list[str] | None = None,
        s3: S3Config | None = None,
        ports: StackPorts | None = None,
    ) -> None:
        """``gateway=True`` also runs ``styx gateway`` with the extra ``gateway_args`` once the workers
        are up; its URL is then :attr:`gateway_url`. ``ports``: see :class:`StackPorts` (default: all
        free ones)."""
        self.data_dir = data_dir
        self.n_workers = workers
        self.durable = durable
        self.external_kafka = kafka
        self.env = {**os.environ, **(env or {})}
        self.secret = self.env.get(SECRET_ENV) or secrets.token_urlsafe(32)
        self.env[SECRET_ENV] = self.secret
        # The local S3's keys: fresh per stack (printed by `styx up`, kept in its cluster file).
        self.s3_keys = (
            self.env.get("STYX_S3_ACCESS_KEY") or f"styx-{secrets.token_hex(4)}",
            self.env.get("STYX_S3_SECRET_KEY") or secrets.token_urlsafe(24),
        )
        self.log_dir = log_dir or data_dir / "logs"
        self.s3: SeaweedS3 | None = None
        self.broker: TansuBroker | None = None
        self.broker_pid: int | None = None  # the broker process the cluster's logs live in
        self.said_lost = False  # supervise() said that the cluster stopped because its log was lost
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarted_at: dict[str, float] = {}  # when supervise() last restarted each process
        self.left: list[str] = []  # workers that left the cluster (drained) and were not restarted
        self.coordinator = ""
        self.kafka = ""
        self.with_gateway = gateway
        self.ports = ports or StackPorts()
        self.port_notes: list[str] = []  # "kafka: port 9092 is taken, using 17311", for the user
        self.gateway_args = list(gateway_args or [])
        self.gateway_url = ""
        self.external_s3 = s3
        self.metrics_ports: dict[str, int] = {}  # process name -> its /metrics port (kept on restart)
        self.reaped: list[str] = []  # processes an earlier stack on data_dir left running, ended by start()

    # ---- start / stop ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalStack:
        """Start S3 and Tansu (unless external), the coordinator and the workers, and wait for the
        workers to register. A start that fails half way (a process that exits, a timeout, Ctrl-C)
        stops what it started before it raises; :meth:`stop` may still be called."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        self.reaped = pidfile.reap(self.data_dir)  # what an earlier stack here left running
        self.log_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault(SECRET_ENV, self.secret)  # this process is the stack's client
        if self.external_kafka is None:
            from styx_py.stack.seaweed import SeaweedS3
            from styx_py.stack.tansu import TansuBroker

            self.s3 = SeaweedS3(
                self.data_dir / "s3",
                buckets=["styx-snapshots", "tansu"],
                access_key=self.s3_keys[0],
                secret_key=self.s3_keys[1],
                log_path=self.log_dir / "seaweedfs.log",
                s3_port=self.ports.s3,
            ).start()
            pidfile.record(self.data_dir, "seaweedfs", self.s3.pid)
            if self.s3.s3_port_taken:
                self._note("s3", self.ports.s3, self.s3.config.endpoint)
            storage: S3Config | Literal["memory"] = self.s3.config if self.durable else "memory"
            # Reply routing off on Tansu (Config.reply_routing): with routing, several workers produce to
            # one egress partition, and a client reading its tail was seen to miss one reply in ~4 000
            # (the record is on the log; Tansu seems to expose a later batch before an earlier one of
            # another producer). Without it each egress partition has one producer. On S3 it also
            # starves the reader of the one busy partition.
            self.env.setdefault("STYX_REPLY_ROUTING", "false")
            # Tansu lists a partition's every stored batch on each fetch that returns data, so a tailed
            # partition costs more with every batch (benchmarks/results/broker-cost.md): the ingress
            # and egress topics start new segments every 2 s (Config.log_segment_s, core/segments.py).
            self.env.setdefault("STYX_LOG_SEGMENT_S", "2")
            self.broker = TansuBroker(
                storage, bucket="tansu", log_path=self.log_dir / "tansu.log", port=self.ports.kafka
            ).start()
            self.kafka = self.broker.bootstrap
            self.broker_pid = self.broker.pid
            pidfile.record(self.data_dir, "tansu", self.broker.pid)
            if self.broker.port_taken:
                self._note("kafka", self.ports.kafka, self.kafka)
        else:
            self.kafka = self.external_kafka
        s3 = self.s3.config if self.s3 is not None else self.external_s3
        if s3 is not None:
            # Snapshots go to S3; every process reads the same settings (one source of truth).
            self.env.setdefault("STYX_S3_ENDPOINT", s3.endpoint)
            self.env.setdefault("STYX_S3_ACCESS_KEY", s3.access_key)
            self.env.setdefault("STYX_S3_SECRET_KEY", s3.secret_key)
            self.env.setdefault("STYX_S3_REGION", s3.region)
        self.coordinator = f"127.0.0.1:{self._port('coordinator', self.ports.coordinator)}"
        self.start_coordinator()
        for i in range(1, self.n_workers + 1):
            self.start_worker(f"w{i}")
        self._wait_registered(timeout_s)
        if self.with_gateway:
            self._start_gateway(timeout_s)

    def _note(self, name: str, wanted: int, got: str) -> None:
        self.port_notes.append(f"{name}: port {wanted} is taken, using {got.rpartition(':')[2]}")

    def _port(self, name: str, wanted: int) -> int:
        """``wanted`` if free, else a free port (noted in :attr:`port_notes`); 0: a free port."""
        port, taken = preferred_port(wanted)
        if taken:
            self._note(name, wanted, str(port))
        return port

    def _start_gateway(self, timeout_s: float) -> None:
        port = self._port("gateway", self.ports.gateway)
        args = ["gateway", "--coordinator", self.coordinator, "--port", str(port), *self.gateway_args]
        self._spawn("gateway", args)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1.0) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the gateway did not answer /healthz within {timeout_s}s; see {self.log_dir}"
                )
            time.sleep(0.05)
        self.gateway_url = url

    def start_coordinator(self) -> None:
        """Start (or restart, on the same port) the coordinator; a restart resumes from S3."""
        port = self.coordinator.rpartition(":")[2]
        self._spawn(
            "coordinator",
            ["coordinator", "--port", port, "--kafka", self.kafka, "--workers", str(self.n_workers)],
            metrics=True,
        )

    def start_worker(self, name: str) -> None:
        """Start (or restart, after a crash) worker ``name``; a restart makes the cluster recover."""
        args = ["worker", "--id", name, "--coordinator", self.coordinator, "--kafka", self.kafka]
        self._spawn(name, args, metrics=True)

    def dead_workers(self) -> list[str]:
        return sorted(n for n, p in self.procs.items() if n.startswith("w") and p.poll() is not None)

    def _spawn(self, name: str, args: list[str], *, metrics: bool = False) -> None:
        env = self.env
        if metrics:
            port = self.metrics_ports.get(name) or self._port(f"metrics {name}", self._metrics_port(name))
            self.metrics_ports[name] = port
            env = {**env, "STYX_METRICS_PORT": str(port), "STYX_METRICS_HOST": "127.0.0.1"}
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child process
        self.procs[name] = lifeline.popen(
            [sys.executable, "-m", "styx_py.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        pidfile.record(self.data_dir, name, self.procs[name].pid)

    def _wait_registered(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                status = asyncio.run(admin(self.coordinator, StatusRequest(), 2.0, self.secret))
            except StyxError:
                status = {"workers": []}
            if len(status["workers"]) >= self.n_workers:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"workers did not register within {timeout_s}s; see {self.log_dir}")
            time.sleep(0.05)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ServiceError(f"{name} exited with code {proc.returncode}:\n{tail}")

    def supervise(self) -> list[str]:
        """Restart what died (as Kubernetes would), and kill-and-restart workers the coordinator
        declared failed (a hung event loop); a worker that left the cluster (drained: exit code 0) is
        not restarted, and new workers are started while ``styx scale`` asked for more. Returns a line
        per change for the operator's terminal; the cluster recovers or reshapes."""
        said: list[str] = self._supervise_broker()
        restarted: list[str] = []
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            if name.startswith("w") and proc.returncode == 0:
                del self.procs[name]  # it left the cluster when told to (styx scale)
                self.left.append(name)
                said.append(f"{name} left the cluster (drained): not restarted")
                continue
            if name == "coordinator":
                self.start_coordinator()
            elif name.startswith("w"):
                self.start_worker(name)
                self.restarted_at[name] = time.monotonic()
            else:
                self.check_alive()  # the gateway has no state to recover: report it
            restarted.append(name)
            said.append(f"{name} {_ended(proc.returncode)}: restarted (the cluster recovers)")
        try:
            status = asyncio.run(admin(self.coordinator, StatusRequest(), 2.0, self.secret))
        except StyxError:
            status = {}  # the coordinator is restarting
        if status.get("state") == "log-lost" and not self.said_lost:
            self.said_lost = True  # once: the cluster stays stopped
            said.append(f"the cluster stopped: {status['degraded']}")
        failed = status.get("failed_workers", [])
        desired = status.get("desired_workers")
        running = [n for n in self.procs if n.startswith("w")]
        for _ in range(max(0, (desired or 0) - len(running))):
            name = next(f"w{i}" for i in itertools.count(1) if f"w{i}" not in self.procs)
            self.start_worker(name)  # it registers and joins: partitions move to it
            self.restarted_at[name] = time.monotonic()
            restarted.append(name)
            asked = counted(desired or 0, "worker")
            said.append(f"{name} started: {asked} asked for (partitions move to it)")
        for name in failed:
            # A worker started moments ago is still booting and registering: the coordinator lists it
            # as failed until it does. Killing it again would restart it forever.
            booting = (
                time.monotonic() - self.restarted_at.get(name, -WORKER_RESTART_GRACE_S)
                < WORKER_RESTART_GRACE_S
            )
            if name in self.procs and name not in restarted and not booting:
                self.kill(name)
                self.start_worker(name)
                self.restarted_at[name] = time.monotonic()
                restarted.append(name)
                said.append(f"{name} hung (declared failed): restarted (the cluster recovers)")
        return said

    def _supervise_broker(self) -> list[str]:
        """The broker this stack started died: on S3 storage (``--durable``) it is started again, its
        data intact, and the cluster rides it out; in memory its data died with it, so the stack stops
        (:class:`BrokerLost`): a cluster that went on would serve from state its logs no longer hold."""
        broker = self.broker
        if broker is None or (broker.running and broker.pid == self.broker_pid):
            return []
        code = broker.exit_code
        ended = "was restarted" if broker.running else "stopped" if code is None else _ended(code)
        if not self.durable:
            raise BrokerLost(
                f"the Kafka broker (Tansu, in memory) {ended}: a broker restart loses the cluster's "
                "data (every topic comes back empty), so the stack stops rather than serve on. Start a "
                "fresh cluster with 'styx up', or keep the logs with 'styx up --durable' "
                f"(log {broker.log_path})"
            )
        said = f"tansu {ended}"
        if not broker.running:
            broker.restart(hard=True)
            said += ": restarted on its S3 storage"
        self.broker_pid = broker.pid
        return [f"{said} (the cluster keeps its logs)"]

    def deploy(self, import_path: str) -> dict[str, Any]:
        return asyncio.run(admin(self.coordinator, DeployRequest(import_path), secret=self.secret))

    def status(self) -> dict[str, Any]:
        return asyncio.run(admin(self.coordinator, StatusRequest(), secret=self.secret))

    def wait_for(
        self,
        ok: Callable[[dict[str, Any]], bool],
        what: str,
        timeout_s: float = 180,
        *,
        supervise: bool = True,
    ) -> dict[str, Any]:
        """Poll ``styx status`` until ``ok`` holds for it (supervising meanwhile, as ``styx up`` does,
        unless a worker is gone on purpose: a supervisor would start a replacement); that status."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if supervise:
                self.supervise()
            status = self.status()
            if ok(status):
                return status
            time.sleep(0.1)  # polling the cluster's status, bounded by the deadline
        raise ServiceError(f"not {what} after {timeout_s}s: {status.get('state')}, {status.get('workers')}")

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait()

    def stop(self, timeout_s: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.broker is not None:
            self.broker.stop()
        if self.s3 is not None:
            self.s3.stop()
        pidfile.forget(self.data_dir)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def endpoints(self) -> dict[str, str]:
        out = {"coordinator": self.coordinator, "kafka": self.kafka}
        if self.s3 is not None:
            out["s3"] = self.s3.config.url
        if self.gateway_url:
            out["gateway"] = self.gateway_url
        for name in self.metrics_ports:
            out[f"metrics {name}"] = self.metrics_url(name)
        return out

    def _metrics_port(self, name: str) -> int:
        """The port ``name`` asks for: ``ports.metrics`` for the coordinator, ``+ N`` for worker wN."""
        if not self.ports.metrics:
            return 0
        return self.ports.metrics + (0 if name == "coordinator" else int(name.removeprefix("w")))

    def client_env(self) -> dict[str, str]:
        """The ``STYX_*`` settings a client of this stack needs (``styx up`` prints and saves them):
        endpoints, the S3 keys (for snapshots and the audit) and the cluster secret."""
        out = {"STYX_COORDINATOR": self.coordinator, "STYX_KAFKA_BOOTSTRAP": self.kafka}
        if self.gateway_url:
            out["STYX_GATEWAY_URL"] = self.gateway_url
        for name in ("STYX_S3_ENDPOINT", "STYX_S3_ACCESS_KEY", "STYX_S3_SECRET_KEY", "STYX_S3_REGION"):
            if self.env.get(name):
                out[name] = self.env[name]
        out[SECRET_ENV] = self.secret
        return out

    def pids(self) -> dict[str, int]:
        """Process id of every running process of the stack, by name (coordinator, w1…, gateway, and
        the broker and S3 server it started), e.g. to charge each its CPU time in a benchmark."""
        out = {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}
        for name, service in (("tansu", self.broker), ("seaweedfs", self.s3)):
            if service is not None and service.pid is not None:
                out[name] = service.pid
        return out

    def metrics_url(self, name: str) -> str:
        """``http://127.0.0.1:PORT/metrics`` of the coordinator or worker ``name``."""
        return f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
