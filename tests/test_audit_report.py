"""The audit's verdicts, reports and exit codes, without Spark: skipped checks are never a pass, the
HTML report is one self-contained file, time is shown from the run's start, and an audit that cannot
reach Kafka or S3 exits with code 2 and one readable line (no traceback) before any JVM starts."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import uuid
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import InputPartition

from styx_py.audit.analytics import with_logged_time, with_run_time
from styx_py.audit.failures import EXIT_COULD_NOT_RUN, last_error_line
from styx_py.audit.kafka_source import KafkaRangeReader
from styx_py.audit.report import write_report
from styx_py.audit.rules import CHECKS, ERROR, SKIPPED, WARNING, Finding, skipped_checks, verdicts
from styx_py.cli import main as styx_main
from styx_py.stack.screenshot import find_browser, screenshot
from styx_py.stack.services import SeaweedS3, TansuBroker, create_topics

# ---- skipped is not pass --------------------------------------------------------------------------


def counts_of(findings: list[Finding]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for f in findings:
        out.setdefault(f.check, {}).setdefault(f.severity, 0)
        out[f.check][f.severity] += 1
    return out


def test_no_snapshot_skips_the_state_checks_with_the_reason() -> None:
    found = skipped_checks("ycsbt", "styx_benchmarks.bank:app", True, "no snapshot in bucket 'b'")
    by = {v.check: v for v in verdicts(CHECKS, counts_of(found), found)}
    assert by["invariant.ycsbt"].verdict == "skipped"
    assert by["invariant.ycsbt"].reason == "no snapshot in bucket 'b': no state to check"
    assert by["serial.state"].verdict == "skipped"
    assert "no snapshot in bucket 'b'" in by["serial.state"].reason
    assert by["serial.outcome"].verdict == "pass"  # the replay itself still runs
    assert "invariant" not in by  # the generic entry gives way to the workload's
    assert by["exactly_once.lost_reply"].verdict == "pass"


def test_no_workload_or_serial_skips_each_state_check() -> None:
    found = skipped_checks(None, None, True, None)
    by = {v.check: v for v in verdicts(CHECKS, counts_of(found), found)}
    replayed = {"serial.state", "serial.outcome", "effects.response", "effects.continuation", "timers.fired"}
    assert {c for c, v in by.items() if v.verdict == "skipped"} == {"invariant", *replayed}
    assert by["serial.outcome"].reason == "no --workload or --app given: no graph to replay the log with"
    no_serial = skipped_checks("ycsbt", "app:x", False, None)
    assert {f.check for f in no_serial} == replayed
    assert all(f.severity == SKIPPED and f.message.startswith("--no-serial") for f in no_serial)
    assert skipped_checks("ycsbt", "app:x", True, None) == []  # everything can be checked


def test_an_error_fails_a_check_even_beside_a_skip_and_warnings_still_pass() -> None:
    found = [
        Finding("serial.state", "audit", "why", SKIPPED),
        Finding("serial.state", "x", "differs", ERROR),
        Finding("ordering.log", "epoch 9", "last epoch incomplete", WARNING),
    ]
    by = {v.check: v for v in verdicts(CHECKS, counts_of(found), found)}
    assert by["serial.state"].verdict == "FAIL" and by["serial.state"].reason == ""
    assert by["ordering.log"].verdict == "pass (warnings)"


# ---- the report ---------------------------------------------------------------------------------


def tables() -> dict[str, pd.DataFrame]:
    start_ms = 1_795_000_000_000
    seconds = pd.DataFrame(
        {
            "second": [1_795_000_000, 1_795_000_001, 1_795_000_002],
            "replies": [100, 120, 0],
            "committed": [99, 118, 0],
            "aborted": [1, 2, 0],
            "failed": [0, 0, 0],
            "fallback": [0, 0, 0],
            "p50_ms": [20.0, 22.0, float("nan")],
            "p95_ms": [40.0, 44.0, float("nan")],
            "p99_ms": [60.0, 66.0, float("nan")],
            "max_ms": [70, 80, None],
            "mean_ms": [21.0, 23.0, float("nan")],
            "check_replies": [0, 0, 200],
        }
    )
    return {
        "status": pd.DataFrame(
            {"traffic": ["workload", "check"], "status": ["committed"] * 2, "replies": [217, 200]}
        ),
        "latency_by_function": pd.DataFrame(
            {
                "traffic": ["workload", "check"],
                "operator": ["account"] * 2,
                "function": ["transfer", "balance"],
                "p50_ms": [21.0, 5.0],
                "p99_ms": [63.0, 9.0],
            }
        ),
        "abort_causes": pd.DataFrame({"cause": ["insufficient <credit> N"], "replies": [3]}),
        "per_second": with_run_time(seconds, start_ms - 500),
        "epochs": pd.DataFrame({"epoch": [1, 2], "transactions": [10, 12], "duration_ms": [5.0, None]}),
    }


def stats() -> dict[str, object]:
    return {
        "kafka": "127.0.0.1:9092",
        "topics": {"ingress": "in", "egress": "out", "seqlog": "seq"},
        "records": {"ingress": 417, "egress": 417, "seqlog": 4},
        "request_ids": 417,
        "replies": 417,
        "check_replies": 200,
    }


def test_epochs_show_their_time_since_the_run_start_not_a_raw_timestamp() -> None:
    start_ms = 1_763_464_000_250
    raw = pd.DataFrame(
        {
            "epoch": [0, 1],
            "gen": [1, 1],
            "transactions": [3, 4],
            "logged_ms": [start_ms + 750, start_ms + 1755],
        }
    )
    epochs = with_logged_time(raw, start_ms)
    assert "logged_ms" not in epochs.columns and list(epochs.columns[:4]) == [
        "epoch",
        "gen",
        "t_s",
        "logged_at",
    ]
    assert list(epochs["t_s"]) == [0.75, 1.755]
    assert list(epochs["logged_at"]) == ["2025-11-18T11:06:41.000Z", "2025-11-18T11:06:42.005Z"]


def test_per_second_time_is_seconds_since_the_run_start_and_iso_time() -> None:
    sec = tables()["per_second"]
    assert list(sec.columns[:2]) == ["t_s", "time"] and "second" not in sec.columns
    assert list(sec["t_s"]) == [1, 2, 3]  # the run started half a second before the first reply's second
    assert sec["time"].iloc[0] == "2026-11-18T11:06:40Z"


def test_html_report_is_self_contained_with_inline_plots_and_shows_skips(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    found = [
        *skipped_checks("ycsbt", "a:b", True, "no snapshot in bucket 'snaps'"),
        Finding("ordering.epoch", "tid 4", "<bad> & worse"),
    ]
    counts = counts_of(found)
    md, page = write_report(tmp_path, False, counts, found, stats(), tables(), {"read": 1.5}, CHECKS)
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    images = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(images) >= 4 and all(src.startswith("data:image/png;base64,") for src in images)
    # Nothing to fetch from anywhere: no URL, no external stylesheet or script.
    assert not re.search(r"https?://|<link|<script|@import|url\(", text)
    assert "&lt;bad&gt; &amp; worse" in text  # findings are escaped
    assert "skipped: no snapshot in bucket &#x27;snaps&#x27;: no state to check" in text
    assert "FAILED — 15 of 18 checks passed, 1 failed, 2 skipped (invariant.ycsbt, serial.state)" in text
    assert ">1795000000<" not in text and "2026-11-18T11:06:40Z" in text
    markdown = md.read_text()
    assert "| `serial.state` |" in markdown and "skipped: no snapshot in bucket 'snaps'" in markdown
    assert "**FAILED — 15 of 18 checks passed, 1 failed, 2 skipped" in markdown
    for name in ("throughput", "latency", "latency_by_function", "abort_causes", "epochs"):
        assert f"plots/{name}.png" in markdown


def test_passed_report_with_skips_does_not_say_all_passed(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    found = skipped_checks(None, None, True, None)
    md, page = write_report(tmp_path, True, counts_of(found), found, stats(), tables(), {}, CHECKS)
    assert (
        "**PASSED — 12 of 18 checks passed, 6 skipped (effects.continuation, effects.response, invariant, "
        "serial.outcome, serial.state, timers.fired)**" in md.read_text()
    )
    assert "all 18 checks passed" not in page.read_text()


def test_empty_topics_read_as_no_rows() -> None:
    # With every range empty the source plans no partition, and PySpark calls read() once with a
    # plain InputPartition: it must give no rows (an assertion there would keep the audit of empty
    # topics from running).
    reader = KafkaRangeReader("127.0.0.1:1", ["t"], "ingress", [], 1000, 1.0)
    assert reader.partitions() == []
    assert list(reader.read(InputPartition(None))) == []


def test_error_line_of_a_task_traceback() -> None:
    text = (
        "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        'Traceback (most recent call last):\n  File "x.py", line 3, in f\n    raise TimeoutError(...)\n'
        "TimeoutError: no progress reading styx-ingress/0 for 120.0s\n"
    )
    assert last_error_line(text) == "TimeoutError: no progress reading styx-ingress/0 for 120.0s"
    assert last_error_line("org.apache.spark.SparkException: Job aborted.") == (
        "org.apache.spark.SparkException: Job aborted."
    )


# ---- exit code 2: the audit could not run -------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_styx(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = styx_main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def test_unreachable_kafka_exits_2_with_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    code, _, err = run_styx(["audit", "--kafka", f"127.0.0.1:{port}", "--out", str(tmp_path)], capfd)
    assert code == EXIT_COULD_NOT_RUN
    assert "Traceback" not in err
    [error] = [line for line in err.splitlines() if line.startswith("styx: error:")]
    assert error.startswith(f"styx: error: Kafka at 127.0.0.1:{port} is unreachable (KafkaConnectionError")
    assert "STYX_KAFKA_BOOTSTRAP" in error
    assert re.search(r"^audit \[ *\d+\.\ds\] planning: the high watermarks", err, re.M), err  # progress
    assert not (tmp_path / "spark.log").exists()  # failed before any JVM started


def test_a_bug_in_the_audit_is_raised_with_its_traceback_not_as_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka, S3 or Spark failing is one line and exit code 2; an exception that is none of those (a
    bug in the audit's own driver code) is not dressed up as one."""
    from styx_py.audit import job

    def planning_with_a_bug(cfg: object) -> list[object]:
        raise KeyError("a bug while planning")

    monkeypatch.setattr(job, "plan", planning_with_a_bug)
    with pytest.raises(KeyError, match="a bug while planning"):
        run_styx(["audit", "--kafka", f"127.0.0.1:{closed_port()}", "--out", str(tmp_path)], capfd)


def test_bad_arguments_exit_2(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STYX_KAFKA_BOOTSTRAP", raising=False)
    code, _, err = run_styx(["audit", "--out", str(tmp_path)], capfd)
    assert code == EXIT_COULD_NOT_RUN
    assert (
        err.strip()
        == "styx: error: no Kafka bootstrap address: pass --kafka HOST:PORT or set STYX_KAFKA_BOOTSTRAP"
    )


@pytest.mark.services
def test_s3_credentials_missing_or_wrong_exit_2_saying_what_to_set(
    kafka: TansuBroker,
    s3: SeaweedS3,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("STYX_S3_ACCESS_KEY", "STYX_S3_SECRET_KEY", "STYX_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    topics = {f"audit-{kind}-{uuid.uuid4().hex[:6]}": 1 for kind in ("in", "out", "seq")}
    asyncio.run(create_topics(kafka.bootstrap, topics))
    t_in, t_out, t_seq = topics
    base = ["audit", "--kafka", kafka.bootstrap, "--ingress-topic", t_in, "--egress-topic", t_out]
    base += ["--seqlog-topic", t_seq, "--s3-endpoint", s3.config.endpoint, "--out", str(tmp_path)]

    code, _, err = run_styx(base, capfd)
    assert code == EXIT_COULD_NOT_RUN and "Traceback" not in err, err
    [error] = [line for line in err.splitlines() if line.startswith("styx: error:")]
    assert error.startswith(
        f"styx: error: S3 at {s3.config.endpoint} refused access (AccessDenied): no S3 access key"
    )
    assert "set STYX_S3_ACCESS_KEY and STYX_S3_SECRET_KEY" in error

    wrong = "not-the-secret"
    code, _, err = run_styx([*base, "--s3-access-key", s3.config.access_key, "--s3-secret-key", wrong], capfd)
    assert code == EXIT_COULD_NOT_RUN and "Traceback" not in err, err
    [error] = [line for line in err.splitlines() if line.startswith("styx: error:")]
    assert f"refused access key {s3.config.access_key!r}" in error and wrong not in error
    assert not (tmp_path / "spark.log").exists()


@pytest.mark.services
def test_missing_topic_exits_2_naming_it(
    kafka: TansuBroker, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = f"no-such-topic-{uuid.uuid4().hex[:6]}"
    code, _, err = run_styx(
        ["audit", "--kafka", kafka.bootstrap, "--ingress-topic", missing, "--out", str(tmp_path)], capfd
    )
    assert code == EXIT_COULD_NOT_RUN and "Traceback" not in err, err
    [error] = [line for line in err.splitlines() if line.startswith("styx: error:")]
    assert error.startswith(f"styx: error: topic {missing!r} does not exist on {kafka.bootstrap}")
    assert "--ingress-topic" in error and "STYX_INGRESS_TOPIC" in error


def test_report_screenshot_with_headless_chromium(tmp_path: Path) -> None:
    if find_browser() is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium)")
    (tmp_path / "plots").mkdir()
    _, page = write_report(tmp_path, True, {}, [], stats(), tables(), {}, CHECKS)
    png = screenshot(page, tmp_path / "shot.png", window=(900, 700))
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (900, 700)  # IHDR: width, height
