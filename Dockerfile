# syntax=docker/dockerfile:1
# One image for every styx-py process; the command picks the role:
#
#   docker build -t styx-py:0.1.0 .
#   docker run styx-py:0.1.0 coordinator --host 0.0.0.0 --port 6000 --workers 2 --deploy myapp.graph:app
#   docker run styx-py:0.1.0 worker --id w1 --host 0.0.0.0 --port 7000 --advertise-host w1
#   docker run styx-py:0.1.0 gateway --host 0.0.0.0 --port 8080
#
# Settings come from STYX_* environment variables (docs/operations.md). Your application's code
# goes in a layer on top (docs/deploy.md):
#
#   FROM styx-py:0.1.0
#   COPY --chown=styx:styx myapp/ /app/myapp/
#
# Ports: 6000 coordinator (workers, clients, admin), 7000 worker (peers), 8080 gateway (HTTP),
# 9400 Prometheus metrics and probes of the coordinator and workers (STYX_METRICS_PORT).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment with the runtime dependencies and styx-py -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/styx
WORKDIR /src
# Dependencies first, from the lock (every package of the base and [server] pinned, with hashes; `make
# lock` regenerates it from pyproject.toml): this layer is rebuilt only when the lock changes. The image
# has no local-stack binaries ([local]: deployments bring their own Kafka and S3), plots or Spark.
COPY deploy/docker/requirements.lock ./
RUN /opt/styx/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY styx_py ./styx_py
COPY coordinator ./coordinator
COPY worker ./worker
COPY client ./client
COPY benchmarks ./benchmarks
# --no-deps: nothing beyond the lock; `pip check` fails the build if the lock misses a dependency.
RUN /opt/styx/bin/pip install --no-deps . \
    && /opt/styx/bin/pip check \
    && /opt/styx/bin/python -c "import styx_coordinator.main, styx_worker.main, styx_client.gateway" \
    && /opt/styx/bin/styx --help > /dev/null

# ---- runtime: the environment, tini as PID 1, a non-root user ---------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# tini forwards SIGTERM to styx and reaps children (a bare PID 1 ignores SIGTERM).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 styx \
    && useradd --system --uid 10001 --gid styx --home-dir /app --shell /usr/sbin/nologin styx \
    && mkdir -p /app \
    && chown styx:styx /app
COPY --from=build /opt/styx /opt/styx
ENV PATH=/opt/styx/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
USER 10001:10001
EXPOSE 6000 7000 8080 9400
ENTRYPOINT ["tini", "--", "styx"]
CMD ["--help"]
