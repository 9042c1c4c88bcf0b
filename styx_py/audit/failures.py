"""Why an audit could not run, in one line that says what is wrong and what to set.

The exit codes of ``styx audit``: 0 every check passed (skipped checks are listed, and fail the audit
only with ``--strict``), 1 a check failed, 2 the audit could not run (:class:`AuditError`: Kafka or
S3 unreachable, refused credentials, a missing topic or bucket, bad arguments, Spark failing).

:func:`check_s3` asks S3 before Spark starts (a JVM costs 10-30 s here), so a bad endpoint or
credentials fail at once; :func:`kafka_failure` and :func:`could_not_run` turn what Kafka, minio and
Spark raise into such lines. Any other exception on the driver is a bug in the audit: it is not turned
into such a line but raised with its traceback.
"""

from __future__ import annotations

from minio.error import S3Error
from urllib3.exceptions import HTTPError

from styx_py.audit.options import S3Options
from styx_py.core.errors import StyxError

EXIT_PASSED, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2

_CREDENTIALS_HINT = (
    "set STYX_S3_ACCESS_KEY and STYX_S3_SECRET_KEY (`styx up` prints them as export lines) "
    "or pass --s3-access-key and --s3-secret-key"
)
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}


class AuditError(StyxError):
    """The audit could not run (exit code 2); the message says what is wrong and what to set."""


class MissingData(LookupError):
    """A topic, bucket or snapshot manifest the audit reads does not exist (the message names it)."""


def s3_failure(s3: S3Options, exc: BaseException) -> AuditError:
    """A one-line error for what minio raised while talking to ``s3``."""
    where = f"S3 at {s3.endpoint}"
    if isinstance(exc, S3Error):
        if exc.code in _REFUSED:
            if not s3.access_key or not s3.secret_key:
                missing = "access key" if not s3.access_key else "secret key"
                return AuditError(
                    f"{where} refused access ({exc.code}): no S3 {missing} given; {_CREDENTIALS_HINT}"
                )
            return AuditError(
                f"{where} refused access key {s3.access_key!r} ({exc.code}: {exc.message}); "
                + _CREDENTIALS_HINT
            )
        if exc.code == "NoSuchBucket":
            return AuditError(
                f"{where} has no bucket {s3.bucket!r}: pass --bucket or set STYX_SNAPSHOT_BUCKET "
                "(the cluster's snapshot bucket)"
            )
        return AuditError(f"{where} answered {exc.code}: {exc.message}")
    if isinstance(exc, HTTPError | OSError):
        return AuditError(
            f"{where} is unreachable ({type(exc).__name__}): check --s3-endpoint or STYX_S3_ENDPOINT "
            "(`styx up` prints it)"
        )
    return AuditError(f"{where}: {type(exc).__name__}: {exc}")


def check_s3(s3: S3Options) -> None:
    """Raise :class:`AuditError` unless ``s3`` answers, accepts the credentials and has the bucket."""
    try:
        exists = s3.client().bucket_exists(s3.bucket)
    except (S3Error, HTTPError, OSError) as exc:
        raise s3_failure(s3, exc) from exc
    if not exists:
        raise s3_failure(s3, S3Error(None, "NoSuchBucket", "", s3.bucket, "", ""))  # type: ignore[arg-type]


def kafka_failure(bootstrap: str, exc: BaseException) -> AuditError:
    """A one-line error for what planning the offset ranges on ``bootstrap`` raised."""
    if isinstance(exc, MissingData):  # kafka_source.plan_ranges: a topic with no partitions
        return AuditError(
            f"{exc}: pass --ingress-topic/--egress-topic/--seqlog-topic or set STYX_INGRESS_TOPIC, "
            "STYX_EGRESS_TOPIC, STYX_SEQLOG_TOPIC (`styx up` prints them)"
        )
    return AuditError(
        f"Kafka at {bootstrap} is unreachable ({type(exc).__name__}: {exc}): check --kafka or "
        "STYX_KAFKA_BOOTSTRAP (`styx up` prints it)"
    )


def last_error_line(text: str) -> str:
    """The line of a (Java or Python) traceback text that names the error: the last ``Name: message``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head and " " not in head and (head.endswith(("Error", "Exception")) or "." in head):
            return line[:300]
    return (lines[-1] if lines else text)[:300]


def could_not_run(exc: BaseException, verbose: bool = False) -> AuditError:
    """Another failure of a run (Spark, a Spark task's Python error, a service): its error line, and
    where to look."""
    hint = "" if verbose else " (--verbose shows the traceback and Spark's log)"
    return AuditError(f"the audit could not run: {last_error_line(str(exc)) or type(exc).__name__}{hint}")
