"""Offline audit and analytics of a styx-py run, on Spark (PySpark), over the Kafka logs and S3 snapshots.

* :mod:`.options` — what an audit reads and checks; the ``styx audit`` arguments (no PySpark);
* :mod:`.rows` — row shapes and the pure decoding of log records and snapshot objects (Arrow);
* :mod:`.kafka_source` — ``styx_kafka``, a Spark data source over Kafka topics (Python Data Source API,
  aiokafka), one input partition per (topic, partition, offset range), ends at the fetch high watermark;
* :mod:`.snapshot_source` — ``styx_snapshots``, a Spark data source over the snapshots in S3 (minio);
* :mod:`.rules` — the audit rules, plain functions (unit-tested without Spark);
* :mod:`.tasks` — the rules as Arrow batch functions, what Spark runs in its Python workers;
* :mod:`.job` — the Spark job that distributes them (``styx audit``, ``spark-submit job.py``);
* :mod:`.analytics` — latency, throughput, aborts and epoch tables (the checks' own reads apart);
* :mod:`.report` — ``report.html`` (self-contained) and ``report.md`` with its PNG plots;
* :mod:`.failures` — the exit codes, and one readable line for an audit that could not run;
* :mod:`.asof` — where the state as of an epoch comes from (snapshot chain, changelog), ``styx sql``'s errors;
* :mod:`.sql` — ``styx sql`` / :func:`styx_py.audit.sql.query`: Spark SQL over each operator's state and
  the logs (docs/sql.md).

Importing this package imports nothing heavy; PySpark, pyarrow and pandas are needed by the sources,
the tasks and the job (``pip install -e '.[spark]'``).
"""
