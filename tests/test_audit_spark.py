"""The audit on a Spark standalone cluster: a master and a worker (1 core) on loopback, from the pyspark
package alone, with its executors in their own JVMs and Python workers.

A small YCSB-T run (200 accounts, 300 transfers, a snapshot in SeaweedFS) is audited by the command a
user runs, ``styx audit --master spark://…``: the clean run passes every check; a copy of the egress
topic with one reply produced twice fails ``exactly_once.duplicate_reply`` and nothing else, with the
same verdicts, check by check, as ``local[2]`` gives for it. The worker's work directory shows the
application ran on its executors.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from styx_benchmarks.workload import Options
from styx_benchmarks.ycsbt import YcsbT
from styx_client import StyxClient
from styx_py.audit.options import S3Options
from styx_py.audit.rows import KafkaRecord
from styx_py.stack.local import LocalStack
from styx_py.stack.services import SeaweedS3, TansuBroker
from styx_py.stack.spark import SparkStandalone, master_state
from tests.service_fixtures import start_cluster
from tests.test_audit import ACCOUNTS, copy_topic, read_until_snapshot, reply_of, transfers

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(900)]

TRANSFERS = 300


@dataclass(frozen=True)
class Topics:
    kafka: str
    ingress: str
    egress: str
    seqlog: str
    s3: S3Options
    changelog: str


async def drive(stack: LocalStack) -> None:
    workload = YcsbT(Options(keys=ACCOUNTS, seed=5))
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        await workload.load(client, progress=lambda _: None)
        await transfers(client, workload, random.Random(5), TRANSFERS)
        await read_until_snapshot(stack, client, [])


@pytest.fixture(scope="module")
def run(kafka: TansuBroker, s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topics]:
    tmp = tmp_path_factory.mktemp("audit-spark-cluster")
    with start_cluster(tmp, kafka, s3=s3, app=YcsbT.app, settings={"snapshot_interval_s": "0.2"}) as stack:
        asyncio.run(drive(stack))
        env = stack.env
    c = s3.config
    yield Topics(
        kafka.bootstrap,
        env["STYX_INGRESS_TOPIC"],
        env["STYX_EGRESS_TOPIC"],
        env["STYX_SEQLOG_TOPIC"],
        S3Options(c.endpoint, c.access_key, c.secret_key, env["STYX_SNAPSHOT_BUCKET"], c.region),
        env["STYX_CHANGELOG_TOPIC"],
    )


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), cores=1, memory="1g") as spark:
        yield spark


def audit(run: Topics, egress: str, out: Path, *master: str) -> tuple[int, list[str]]:
    """``styx audit`` as a user runs it; its exit code and the verdict lines of its summary."""
    s3 = run.s3
    argv = [
        sys.executable,
        "-m",
        "styx_py.cli",
        "audit",
        "--kafka",
        run.kafka,
        "--ingress-topic",
        run.ingress,
    ]
    argv += ["--egress-topic", egress, "--seqlog-topic", run.seqlog, "--s3-endpoint", s3.endpoint]
    argv += ["--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key, "--bucket", s3.bucket]
    argv += ["--workload", "ycsbt", "--keys", str(ACCOUNTS), "--driver-memory", "1g", "--out", str(out)]
    argv += ["--changelog-topic", run.changelog]
    done = subprocess.run([*argv, *master], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode in (0, 1), f"exit {done.returncode}: {done.stderr[-3000:]}"
    assert "starting Spark (" + (master[1] if master else "local[2]") + ")" in done.stderr, done.stderr
    verdicts = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    return done.returncode, verdicts


def test_the_audit_on_a_standalone_cluster_gives_the_verdicts_of_local(
    run: Topics, standalone: SparkStandalone, tmp_path: Path
) -> None:
    on_cluster = ("--master", standalone.url, "--executor-memory", "512m")
    code, clean = audit(run, run.egress, tmp_path / "clean", *on_cluster)
    assert code == 0, clean
    assert len(clean) == 18 and all(line.endswith(": pass") for line in clean), clean
    work = standalone.worker.work_dir
    apps = [app for app in work.iterdir() if app.name.startswith("app-")]
    assert apps and any((app / "0" / "stderr").exists() for app in apps), "no executor ran on the worker"
    assert master_state(standalone.master.ui_port)["completedapps"], "the master ran no application"

    copy = f"{run.egress}-dup-{uuid.uuid4().hex[:6]}"

    def duplicate_one(records: list[KafkaRecord]) -> list[KafkaRecord]:
        victim = next(r for r in records if reply_of(r).status == "committed")
        return [*records, victim]

    asyncio.run(copy_topic(run.kafka, run.egress, copy, duplicate_one))
    code, tampered = audit(run, copy, tmp_path / "tampered", *on_cluster)
    assert code == 1, tampered
    failed = [line for line in tampered if ": FAIL" in line]
    assert failed == ["exactly_once.duplicate_reply: FAIL (1 errors, 0 warnings)"], tampered
    local_code, local = audit(run, copy, tmp_path / "tampered-local")
    assert (local_code, local) == (code, tampered)
