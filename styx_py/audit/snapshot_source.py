"""A Spark data source over the snapshots in S3 (MinIO, SeaweedFS, AWS), read with the ``minio`` client.

``spark.read.format("styx_snapshots")`` yields one row per written entity of every snapshot object
(a per-partition delta, or a compacted base) that makes up the chosen snapshot; one Spark input
partition per up to ``objects_per_task`` objects (default 32), in the manifest's order. Rows: see
:data:`styx_py.audit.rows.SNAPSHOT_SCHEMA`. An entity's value *in the snapshot* is its row with the
highest ``object_epoch`` (a null value: deleted); :func:`state_of` computes that.

Options: ``endpoint`` (host:port, required), ``access_key``, ``secret_key``, ``region``, ``secure``
(default from the ``STYX_S3_*`` environment), ``bucket`` (default ``styx-snapshots``), ``snapshot``:
``latest`` (default: the newest manifest), an epoch (that manifest; only the newest is retained by the
cluster, older ones may be gone), or ``all`` (every object under ``snapshots/`` whether a manifest
lists it or not, each as its own snapshot id: for forensics); ``max_object_epoch``: only the objects
of epochs <= it (the chain of an older snapshot, skipped at planning rather than read and filtered);
``objects_per_task`` (see above).

Object and manifest names come from :mod:`styx_py.core.blobs`; their contents are
:class:`~styx_py.core.wire.PartitionSnapshot` and :class:`~styx_py.core.wire.Manifest` (msgpack).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from minio import Minio
from minio.error import S3Error
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from styx_py.audit.arrow import spark_schema
from styx_py.audit.failures import MissingData
from styx_py.audit.options import S3Options
from styx_py.audit.rows import SNAPSHOT_SCHEMA, decode_snapshot_object
from styx_py.core.blobs import epoch_of
from styx_py.core.wire import ClusterMeta, Manifest

META_KEY = "cluster/meta"  # coordinator.snapshots.META_KEY: the coordinator's durable state
_manifest_decoder = msgspec.msgpack.Decoder(Manifest)
_meta_decoder = msgspec.msgpack.Decoder(ClusterMeta)


def get_object(client: Minio, bucket: str, name: str) -> bytes | None:
    try:
        resp = client.get_object(bucket, name)
    except S3Error as exc:
        if exc.code in ("NoSuchKey", "NoSuchBucket"):
            return None
        raise
    try:
        return bytes(resp.read())
    finally:
        resp.close()
        resp.release_conn()


def list_names(client: Minio, bucket: str, prefix: str) -> list[str]:
    try:
        return sorted(str(o.object_name) for o in client.list_objects(bucket, prefix, recursive=True))
    except S3Error as exc:
        if exc.code == "NoSuchBucket":
            raise MissingData(f"bucket {bucket!r} does not exist") from exc
        raise


def load_manifest(client: Minio, bucket: str, which: str = "latest") -> Manifest | None:
    """The manifest of snapshot ``which`` (``latest`` or an epoch); None when there is none."""
    names = [n for n in list_names(client, bucket, "manifests/") if n.endswith(".manifest")]
    if which != "latest":
        names = [n for n in names if epoch_of(n) == int(which)]
        if not names:
            raise MissingData(f"no manifest of snapshot {which} in bucket {bucket!r}")
    if not names:
        return None
    name = max(names, key=epoch_of)
    data = get_object(client, bucket, name)
    if data is None:
        raise MissingData(f"manifest {name} vanished while being read (retention ran?)")
    return _manifest_decoder.decode(data)


def load_meta(client: Minio, bucket: str) -> ClusterMeta | None:
    """The coordinator's durable state (its ``epoch_generations`` say which generation ran each epoch)."""
    data = get_object(client, bucket, META_KEY)
    return None if data is None else _meta_decoder.decode(data)


@dataclass(frozen=True, slots=True)
class SnapshotObject:
    snapshot_id: int
    name: str
    epoch: int


def plan_objects(client: Minio, bucket: str, which: str) -> list[SnapshotObject]:
    if which == "all":
        names = [n for n in list_names(client, bucket, "snapshots/") if n.endswith((".delta", ".base"))]
        return [SnapshotObject(epoch_of(n), n, epoch_of(n)) for n in names]
    manifest = load_manifest(client, bucket, which)
    if manifest is None:
        return []
    return [
        SnapshotObject(manifest.epoch, name, epoch_of(name))
        for _, names in sorted(manifest.deltas.items())
        for name in names
    ]


DEFAULT_OBJECTS_PER_TASK = 32


class ObjectPartition(InputPartition):
    def __init__(self, objs: Sequence[SnapshotObject]) -> None:
        super().__init__(objs[0].name)
        self.objs = list(objs)


class StyxSnapshotSource(DataSource):
    """``spark.read.format("styx_snapshots")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "styx_snapshots"

    def schema(self) -> StructType:
        return spark_schema(SNAPSHOT_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self.options
        upto = opts.get("max_object_epoch")
        return SnapshotReader(
            S3Options.parse(opts),
            opts.get("snapshot", "latest"),
            None if upto is None else int(upto),
            int(opts.get("objects_per_task", DEFAULT_OBJECTS_PER_TASK)),
        )


class SnapshotReader(DataSourceReader):
    def __init__(
        self,
        s3: S3Options,
        which: str,
        max_object_epoch: int | None = None,
        objects_per_task: int = DEFAULT_OBJECTS_PER_TASK,
    ) -> None:
        if which not in ("latest", "all") and not which.lstrip("-").isdigit():
            raise ValueError(f"option 'snapshot' must be 'latest', 'all' or an epoch, got {which!r}")
        if objects_per_task < 1:
            raise ValueError(f"option 'objects_per_task' must be 1 or more, got {objects_per_task}")
        self.s3 = s3
        self.which = which
        self.max_object_epoch = max_object_epoch
        self.objects_per_task = objects_per_task

    def partitions(self) -> Sequence[InputPartition]:
        objs = plan_objects(self.s3.client(), self.s3.bucket, self.which)
        if self.max_object_epoch is not None:
            objs = [o for o in objs if o.epoch <= self.max_object_epoch]
        n = self.objects_per_task
        return [ObjectPartition(objs[i : i + n]) for i in range(0, len(objs), n)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, ObjectPartition):
            return  # no objects: PySpark calls read() once with a plain InputPartition of its own
        client = self.s3.client()
        for obj in partition.objs:
            data = get_object(client, self.s3.bucket, obj.name)
            if data is None:
                raise FileNotFoundError(
                    f"snapshot object {obj.name} listed in snapshot {obj.snapshot_id} is missing"
                )
            yield decode_snapshot_object(obj.snapshot_id, obj.name, obj.epoch, data)
