"""S3 on a developer machine: SeaweedFS ``weed mini`` as a managed subprocess, and the ``minio``
client settings (:class:`S3Config`) the rest of the stack builds its clients from."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from styx_py.io.s3 import s3_client
from styx_py.stack.binaries import weed_binary
from styx_py.stack.errors import ServiceError
from styx_py.stack.net import GRPC_OFFSET, free_port, preferred_port
from styx_py.stack.process import SERVICE_START_TIMEOUT_S, ManagedProcess, poll_until

__all__ = ["S3_TRANSIENT", "S3Config", "SeaweedS3", "ensure_buckets", "minio_client"]


@dataclass
class S3Config:
    """How to reach an S3 endpoint; what the rest of styx needs to build a client."""

    endpoint: str  # "host:port", no scheme (the minio client's convention)
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    secure: bool = False
    ca_file: str = ""  # the CA of the endpoint's certificate (secure; empty: the system's)

    @property
    def url(self) -> str:
        """The endpoint with its scheme, as AWS SDKs and Tansu (``AWS_ENDPOINT``) want it."""
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"


def minio_client(config: S3Config, *, fail_fast: bool = False) -> Minio:
    """Build a ``minio`` client for ``config``.

    ``fail_fast`` disables urllib3 retries and uses short timeouts: a readiness poll wants
    one quick attempt per iteration, not minio's default of several retries with backoff.
    """
    return s3_client(
        config.endpoint,
        config.access_key,
        config.secret_key,
        config.region,
        secure=config.secure,
        ca_file=config.ca_file,
        fail_fast=fail_fast,
    )


def ensure_buckets(client: Minio, buckets: Sequence[str]) -> None:
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
S3_TRANSIENT: tuple[type[BaseException], ...] = (
    MinioException,
    urllib3.exceptions.HTTPError,
    OSError,
)


class SeaweedS3(ManagedProcess):
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
        s3_port: int | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``s3_port``: the S3 port to use when it (and its gRPC port + 10000) is free, else a free one
        (:attr:`s3_port_taken` then says so); None: a free one. The other ports are always free ones.
        ``tls``: (certificate, key, CA) PEM files: S3 is served over HTTPS only."""
        self.tls = tls
        self.data_dir = Path(data_dir)
        super().__init__(log_path if log_path is not None else self.data_dir / "weed.log")
        self.buckets = list(buckets)
        self.access_key = access_key
        self.secret_key = secret_key
        self._ports: dict[str, int] | None = None
        self.s3_port = s3_port
        self.s3_port_taken = False

    @property
    def config(self) -> S3Config:
        """Connection settings; valid once started (and unchanged across restarts)."""
        if self._ports is None:
            raise ServiceError("SeaweedS3 not started yet: no port chosen")
        return S3Config(
            endpoint=f"127.0.0.1:{self._ports['s3']}",
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=self.tls is not None,
            ca_file="" if self.tls is None else str(self.tls[2]),
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
        return [q for port in self._ports.values() for q in (port, port + GRPC_OFFSET)]

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
        if self.tls is not None:
            cmd += [f"-s3.cert.file={self.tls[0]}", f"-s3.key.file={self.tls[1]}"]
        return cmd

    def _env(self) -> dict[str, str]:
        # Its log files go to the temp directory: to one in its own data directory instead.
        tmp = self.data_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "TMPDIR": str(tmp)}

    def _after_exit(self) -> None:
        # Its processes talk over Unix sockets named by their ports, always in /tmp (TMPDIR aside), and
        # leave them there: those of this instance's ports go with it.
        if self._ports is None:
            return
        for port in self._listen_ports():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)

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
            ensure_buckets(client, wanted)
            client.put_object(probe_bucket, probe_key, io.BytesIO(b"ok"), 2)
            client.remove_object(probe_bucket, probe_key)

        poll_until(
            attempt,
            deadline=deadline,
            transient=S3_TRANSIENT,
            check_alive=self._check_alive,
            on_timeout=lambda err: self._timeout_error("authenticated S3 PUT", err),
        )
        if probe_bucket not in self.buckets:
            with contextlib.suppress(*S3_TRANSIENT):  # an empty leftover bucket is harmless
                client.remove_bucket(probe_bucket)
        self._check_auth_enforced()

    def _check_auth_enforced(self) -> None:
        """Fail loudly if SeaweedFS accepts any credentials.

        Guards against its silent fallback to no auth; production S3 always enforces auth,
        so tests against an open server would prove nothing about credentials.
        """
        wrong = dataclasses.replace(self.config, secret_key=self.secret_key + "-wrong")
        try:
            minio_client(wrong, fail_fast=True).list_buckets()
        except S3Error:
            return
        raise ServiceError(
            f"SeaweedFS at {self.config.endpoint} accepted a wrong secret key: auth is off "
            f"(identities file {self.identities_path})"
        )

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        """Launch ``weed mini`` and return once an authenticated PUT succeeds.

        Ports are chosen on the first start and kept for later starts.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._ports is None:
            s3_port, self.s3_port_taken = preferred_port(self.s3_port, also_plus_10000=True)
            self._ports = {
                name: free_port(also_plus_10000=True) for name in ("master", "volume", "filer", "admin")
            }
            self._ports["s3"] = s3_port
        self._write_identities()
        self._launch(timeout_s)
        return self
