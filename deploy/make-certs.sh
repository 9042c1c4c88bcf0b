#!/bin/sh
# The styx-py cluster's TLS identity for mutual TLS on the internal ports, made with openssl in DIR:
#   ca.crt   the CA every node verifies its peers against     (STYX_TLS_CA_FILE)
#   tls.crt  the certificate every node presents, signed by it (STYX_TLS_CERT_FILE)
#   tls.key  its key, readable by its owner only               (STYX_TLS_KEY_FILE)
# The certificate names the cluster (SERVER_NAME, default styx-cluster: STYX_TLS_SERVER_NAME), which
# whoever dials a node checks. The CA's key is deleted once it signed: nothing else can join with a
# certificate of this CA. Files that exist are kept; to rotate, delete DIR and run this again, then
# restart every process (docs/deploy.md#security).
#   usage: [SERVER_NAME=…] [OWNER=uid:gid] deploy/make-certs.sh DIR [DAYS]
set -eu
dir=${1:?usage: make-certs.sh DIR [DAYS]}
days=${2:-365}
name=${SERVER_NAME:-styx-cluster}
mkdir -p "$dir"
chmod 755 "$dir"
if [ -n "${OWNER:-}" ]; then chown "$OWNER" "$dir"; fi
cd "$dir"
if [ -e tls.crt ]; then
  echo "make-certs: $dir/tls.crt exists: kept"
  exit 0
fi
umask 077
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# shellcheck disable=SC2086  # $ec is several arguments
openssl req -x509 $ec -days "$days" -subj "/CN=styx-py cluster CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout ca.key -out ca.crt 2>/dev/null
# shellcheck disable=SC2086
openssl req $ec -subj "/CN=$name" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
  "$name" > tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" -extfile tls.ext \
  -out tls.crt 2>/dev/null
rm -f ca.key ca.srl tls.csr tls.ext
chmod 644 ca.crt tls.crt
chmod 600 tls.key
if [ -n "${OWNER:-}" ]; then chown "$OWNER" ca.crt tls.crt tls.key; fi
echo "make-certs: $dir/ca.crt, tls.crt, tls.key for $name, valid $days days"
