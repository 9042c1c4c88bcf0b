"""Offline audit and analytics of a styx-py run, on Spark (PySpark), over the Kafka logs and S3 snapshots.

* :mod:`.rows` — row shapes and the pure decoding of log records and snapshot objects (Arrow);
* :mod:`.kafka_source` — ``styx_kafka``, a Spark data source over Kafka topics (Python Data Source API,
  aiokafka), one input partition per (topic, partition, offset range), ends at the fetch high watermark;
* :mod:`.snapshot_source` — ``styx_snapshots``, a Spark data source over the snapshots in S3 (minio);
* :mod:`.rules` — the audit rules, plain functions (unit-tested without Spark);
* :mod:`.job` — the Spark job that distributes the rules and computes the analytics (``styx audit``);
* :mod:`.report` — ``report.md`` and its PNG plots.

Importing this package imports nothing heavy; PySpark is needed only by the sources and the job
(``pip install -e '.[spark]'``).
"""
