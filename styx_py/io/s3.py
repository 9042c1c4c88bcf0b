"""The snapshot blob store on S3 (MinIO / SeaweedFS via ``minio``).

The S3 client is synchronous; calls run in a thread so the epoch loop never waits on S3. What S3 or
the connection to it fails with (minio's ``S3Error`` and other ``MinioException``, urllib3's
``HTTPError`` once its retries are spent) is raised as :class:`~styx_py.core.errors.BackendError`,
the blob store port's operating error (an ``OSError``); anything else is a bug and is raised as it is.
"""

from __future__ import annotations

import asyncio
import builtins
import io
import os
from collections.abc import Callable
from typing import TypeVar

import urllib3
import urllib3.exceptions
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error

from styx_py.core.config import Config
from styx_py.core.errors import BackendError

T = TypeVar("T")

S3_TIMEOUT_S = 300.0  # minio's default connect and read timeouts

# What a minio call raises when S3 fails it or cannot be reached (a bad argument is a ValueError: a bug).
S3_FAILURES = (MinioException, urllib3.exceptions.HTTPError)


async def _in_thread(what: str, call: Callable[[], T]) -> T:
    """``call()`` in a thread; what S3 failed it with, as a :class:`BackendError` naming ``what``."""
    try:
        return await asyncio.to_thread(call)
    except S3_FAILURES as exc:
        raise BackendError(f"S3 {what} failed: {type(exc).__name__}: {exc}") from exc


class MinioBlobStore:
    def __init__(self, client: Minio, bucket: str) -> None:
        self.client = client
        self.bucket = bucket
        self._bucket_ready = False

    def _ensure_bucket(self) -> None:
        if not self._bucket_ready:
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as exc:  # another process created it first
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
            self._bucket_ready = True

    async def put(self, key: str, data: bytes) -> None:
        def upload() -> None:
            self._ensure_bucket()
            self.client.put_object(self.bucket, key, io.BytesIO(data), len(data))

        await _in_thread(f"put {key}", upload)

    async def get(self, key: str) -> bytes | None:
        def fetch() -> bytes | None:
            try:
                resp = self.client.get_object(self.bucket, key)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    return None
                raise
            try:
                return bytes(resp.read())
            finally:
                resp.close()
                resp.release_conn()

        return await _in_thread(f"get {key}", fetch)

    async def list(self, prefix: str) -> builtins.list[str]:
        def names() -> builtins.list[str]:
            try:
                objects = builtins.list(self.client.list_objects(self.bucket, prefix, recursive=True))
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return []
                raise
            return sorted(str(o.object_name) for o in objects)

        return await _in_thread(f"list {prefix}", names)

    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete ``keys`` (a missing one is no error) with S3's multi-object delete: ``minio`` sends up to
        1 000 keys a request. One request per key made a compaction's retention ~40 requests."""

        def remove() -> None:
            failed = builtins.list(self.client.remove_objects(self.bucket, map(DeleteObject, keys)))
            if failed:
                one = failed[0]
                raise BackendError(
                    f"{len(failed)} of {len(keys)} objects not deleted; {one.name}: {one.message}"
                )

        if keys:
            await _in_thread(f"delete of {len(keys)} objects", remove)


def s3_client(
    endpoint: str,
    access_key: str,
    secret_key: str,
    region: str,
    *,
    secure: bool = False,
    ca_file: str = "",
    fail_fast: bool = False,
) -> Minio:
    """The one way a ``minio`` client is made (processes, the audit, the local stack): HTTPS when
    ``secure``, its certificate verified against ``ca_file`` (empty: ``$SSL_CERT_FILE`` or the system's
    CAs, as minio does). ``fail_fast``: one quick attempt, no retries (a readiness poll)."""
    if fail_fast:
        timeout, retries = urllib3.Timeout(connect=1.0, read=5.0), urllib3.Retry(0, read=0, redirect=0)
    else:  # minio's own defaults
        timeout = urllib3.Timeout(connect=S3_TIMEOUT_S, read=S3_TIMEOUT_S)
        retries = urllib3.Retry(total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504])
    http_client = urllib3.PoolManager(
        timeout=timeout,
        retries=retries,
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_file or os.environ.get("SSL_CERT_FILE") or None,
    )
    return Minio(
        endpoint,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        secure=secure,
        http_client=http_client,
    )


def blob_store_from(config: Config) -> MinioBlobStore | None:
    """The snapshot store a process should use, or None when no S3 endpoint is configured."""
    if not config.s3_endpoint:
        return None
    client = s3_client(
        config.s3_endpoint,
        config.s3_access_key,
        config.s3_secret_key,
        config.s3_region,
        secure=config.s3_secure,
        ca_file=config.s3_ca_file,
    )
    return MinioBlobStore(client, config.snapshot_bucket)
