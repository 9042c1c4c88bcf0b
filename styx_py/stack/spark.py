"""A Spark standalone cluster on loopback, from the pyspark package alone: a master and a worker.

The pyspark wheel ships Spark's jars and ``bin/spark-class``, which is all a standalone cluster needs
(``org.apache.spark.deploy.master.Master`` and ``…worker.Worker``); Java 17 runs them. Each is a
:class:`~styx_py.stack.process.ManagedProcess` (own process group, log file, stopped at exit). The
master's REST submission server is off (one port fewer; jobs come from ``spark-submit`` or a
driver's ``SparkSession``). Readiness is the master's own account: its JSON status says ALIVE, and
then lists the worker as ALIVE with its cores and memory. ::

    with SparkStandalone(cores=1, memory="1g") as spark:
        run(["styx", "audit", "--master", spark.url, "--executor-memory", "512m", ...])

The daemons get 256 MiB of heap each (``SPARK_DAEMON_MEMORY``); executors are what the application
asks for, within the worker's ``memory``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from styx_py.stack.errors import ServiceError
from styx_py.stack.net import free_port
from styx_py.stack.process import SERVICE_START_TIMEOUT_S, ManagedProcess, poll_until

__all__ = ["SparkMaster", "SparkStandalone", "SparkWorker", "spark_home"]

DAEMON_MEMORY = "256m"
_TRANSIENT = (OSError, urllib.error.URLError, ValueError, KeyError)


def spark_home() -> Path:
    """The pyspark package's directory: its ``bin/spark-class`` and ``jars/`` are a Spark install."""
    try:
        import pyspark
    except ImportError as exc:
        raise ServiceError("no pyspark installed: pip install 'styx-py[spark]' (make install)") from exc
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise ServiceError(f"pyspark at {home} has no bin/spark-class")
    return home


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }


def master_state(ui_port: int) -> dict[str, Any]:
    """The master's JSON status (its web UI's ``/json/``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        state: dict[str, Any] = json.loads(response.read())
    return state


class SparkMaster(ManagedProcess):
    name = "spark-master"

    def __init__(self, log_path: Path | None = None) -> None:
        super().__init__(log_path)
        self.port = free_port()
        self.ui_port = free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _listen_ports(self) -> list[int]:
        return [self.port, self.ui_port]

    def _env(self) -> dict[str, str]:
        return _env()

    def _command(self) -> list[str]:
        master = "org.apache.spark.deploy.master.Master"
        ports = ["--port", str(self.port), "--webui-port", str(self.ui_port)]
        return [str(spark_home() / "bin" / "spark-class"), master, "--host", "127.0.0.1", *ports]

    def _wait_ready(self, deadline: float) -> None:
        def alive() -> None:
            if master_state(self.ui_port)["status"] != "ALIVE":
                raise ValueError("the master is not ALIVE yet")

        poll_until(
            alive,
            deadline=deadline,
            transient=_TRANSIENT,
            check_alive=self._check_alive,
            on_timeout=lambda e: self._timeout_error("master ALIVE", e),
        )

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        self._launch(timeout_s)
        return self


class SparkWorker(ManagedProcess):
    name = "spark-worker"

    def __init__(self, master: SparkMaster, work_dir: Path, cores: int, memory: str,
                 log_path: Path | None = None) -> None:  # fmt: skip
        super().__init__(log_path)
        self.master = master
        self.work_dir = work_dir
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()

    def _listen_ports(self) -> list[int]:
        return [self.port, self.ui_port]

    def _env(self) -> dict[str, str]:
        return _env()

    def _command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            self.master.url,
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)),
            *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir)),
        ]

    def _wait_ready(self, deadline: float) -> None:
        def registered() -> None:
            workers = master_state(self.master.ui_port)["workers"]
            if not any(w["port"] == self.port and w["state"] == "ALIVE" for w in workers):
                raise ValueError("the worker has not registered with the master yet")

        poll_until(
            registered,
            deadline=deadline,
            transient=_TRANSIENT,
            check_alive=self._check_alive,
            on_timeout=lambda e: self._timeout_error("worker registered with the master", e),
        )

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._launch(timeout_s)
        return self


class SparkStandalone:
    """A master and one worker (``cores``, ``memory`` for its executors) on 127.0.0.1."""

    def __init__(self, directory: Path | None = None, *, cores: int = 1, memory: str = "1g") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="styx-spark-") if directory is None else None
        self.directory = Path(self._tmp.name) if self._tmp is not None else directory
        assert self.directory is not None
        self.master = SparkMaster(self.directory / "master.log")
        self.worker = SparkWorker(
            self.master, self.directory / "work", cores, memory, self.directory / "worker.log"
        )

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:PORT``: the ``--master`` of spark-submit, or of ``styx audit``."""
        return self.master.url

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        self.master.start(timeout_s)
        try:
            self.worker.start(timeout_s)
        except BaseException:
            self.master.stop()
            raise
        return self

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
