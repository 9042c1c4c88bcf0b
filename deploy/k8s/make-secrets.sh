#!/bin/sh
# What kustomization.yaml's secretGenerator reads; generated here, never committed (.gitignore), so
# `kubectl apply -k deploy/k8s` cannot run with example values: it fails until this has run.
#   secrets.env  STYX_CLUSTER_SECRET and STYX_GATEWAY_TOKEN (random), and your S3 keys and Kafka SASL
#                password, taken from S3_ACCESS_KEY, S3_SECRET_KEY and KAFKA_SASL_PASSWORD
#   tls/         the cluster's CA, certificate and key for mutual TLS on the internal ports
#                (deploy/make-certs.sh)
# Files that exist are kept (delete them to rotate: docs/deploy.md#security).
#   usage: S3_ACCESS_KEY=… S3_SECRET_KEY=… KAFKA_SASL_PASSWORD=… deploy/k8s/make-secrets.sh [DIR]
# With an external secret store, drop the secretGenerator and sync Secrets named styx-secrets and
# styx-tls with those keys instead (an ExternalSecret, docs/deploy.md#kubernetes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
if [ -e "$out/secrets.env" ]; then
  echo "make-secrets: $out/secrets.env exists: kept"
else
  : "${S3_ACCESS_KEY:?set S3_ACCESS_KEY to the S3 access key of the cluster}"
  : "${S3_SECRET_KEY:?set S3_SECRET_KEY to its secret key}"
  : "${KAFKA_SASL_PASSWORD:?set KAFKA_SASL_PASSWORD to the Kafka SASL password of STYX_KAFKA_SASL_USERNAME}"
  umask 077
  {
    echo "STYX_CLUSTER_SECRET=$(openssl rand -hex 32)"
    echo "STYX_GATEWAY_TOKEN=$(openssl rand -hex 24)"
    echo "STYX_S3_ACCESS_KEY=$S3_ACCESS_KEY"
    echo "STYX_S3_SECRET_KEY=$S3_SECRET_KEY"
    echo "STYX_KAFKA_SASL_PASSWORD=$KAFKA_SASL_PASSWORD"
  } > "$out/secrets.env"
  echo "make-secrets: $out/secrets.env (owner-only)"
fi
sh "$here/../make-certs.sh" "$out/tls"
