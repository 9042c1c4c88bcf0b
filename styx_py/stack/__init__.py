"""The local stack: SeaweedFS (S3) and Tansu (Kafka protocol) installed from PyPI and run as
subprocesses (:mod:`styx_py.stack.services`), and a whole local cluster (:mod:`styx_py.stack.local`)."""
