#!/usr/bin/env bash
# Picked up by up.sh after 50-etcd.sh: a certificate authority, certificates made from it, and an
# etcd member that speaks only TLS and asks every client for a certificate, for the fleet's TLS
# tests (issue 14, item 4). Idempotent: the certificates are made once (all again, with the
# member restarted, when one is missing), and a member already answering is only checked. On a
# fresh Debian 12 machine, as root.
#
# What it leaves, under /var/lib/mesh-host-testbed/etcd-tls (keys mode 0600):
#   ca.pem, ca.key          the testbed's CA
#   server.pem, server.key  etcd's certificate: IP SAN 127.0.0.1, for serving and for the
#                           calls etcd's JSON gateway makes to etcd itself (so clientAuth too)
#   node-a, node-b, operator (.pem, .key)
#                           client certificates WITHOUT a common name: etcd's JSON gateway
#                           refuses a certificate with one while etcd's auth is on (it cannot
#                           take the user from it), so a node's user comes from its login
#   named.pem, named.key    a client certificate WITH a common name (CN=node-a), which the
#                           JSON gateway of older mesh-host builds refused (kept: a testbed is
#                           shared by branches, and an older branch's script remakes the whole
#                           set, CA included, when a file it knows is missing)
#   node-a-cn, node-b-cn (.pem, .key)
#                           the nodes' certificates naming them, CN=node-a and CN=node-b: with
#                           etcd's auth on and --client-cert-auth, etcd takes the user from the
#                           CN over gRPC, so a node is known by its certificate alone and holds
#                           no password (issue 24). Made from the CA above when missing or not
#                           signed by it, without remaking the rest.
#   other-ca.pem            a CA that signed nothing here: "the wrong CA"
# and, in the background, etcd serving clients on https://127.0.0.1:23791 (--client-cert-auth,
# auth off) and peers on http://127.0.0.1:23801, data under .../etcd-tls/data, its pid in
# .../etcd-tls/etcd.pid, log /tmp/mesh-host-etcd-tls.log.
set -euo pipefail

DIR=/var/lib/mesh-host-testbed/etcd-tls
CLIENT=127.0.0.1:23791
PEER=127.0.0.1:23801
LOG=/tmp/mesh-host-etcd-tls.log

need=()
command -v openssl >/dev/null || need+=(openssl)
command -v etcd >/dev/null || need+=(etcd-server)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  # As in 50-etcd.sh: the package's own service must not start.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"

# A P-256 key, private to root.
key() { (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null); }

# cert NAME SUBJECT EXTENSIONS: NAME.pem signed by the testbed's CA, with NAME.key.
cert() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  printf '%b' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

client='basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n'
made=1
for f in ca.pem ca.key server.pem server.key node-a.pem node-a.key node-b.pem node-b.key \
  operator.pem operator.key named.pem named.key other-ca.pem; do
  [ -s "$f" ] || made=0
done
if [ "$made" = 0 ]; then
  # All made again, from a new CA: a member already running on the old one is restarted below.
  rm -f ./*.pem ./*.key ./*.srl
  if [ -e "$DIR/etcd.pid" ]; then kill "$(cat "$DIR/etcd.pid")" 2>/dev/null || true; fi
  key ca.key
  openssl req -x509 -new -key ca.key -subj "/O=mesh-host testbed/CN=mesh-host testbed CA" \
    -days 3650 -out ca.pem 2>/dev/null
  cert server "/O=mesh-host testbed/CN=etcd" \
    'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1\n'
  for who in node-a node-b operator; do
    cert "$who" "/O=mesh-host testbed/OU=$who" "$client"
  done
  cert named "/O=mesh-host testbed/CN=node-a" "$client"
  key other-ca.key
  openssl req -x509 -new -key other-ca.key -subj "/CN=not the testbed's CA" -days 3650 \
    -out other-ca.pem 2>/dev/null
  rm -f other-ca.key
fi

# The nodes' certificates with a CN, from the CA there now: made again only when missing or
# signed by another CA (the set above remade), never remaking the CA, so a member and the tests
# running on it are left alone.
for who in node-a node-b; do
  if ! [ -s "$who-cn.pem" ] || ! [ -s "$who-cn.key" ] ||
    ! openssl verify -CAfile ca.pem "$who-cn.pem" >/dev/null 2>&1; then
    cert "$who-cn" "/O=mesh-host testbed/CN=$who" "$client"
  fi
done

healthy() {
  curl -sf --cacert ca.pem --cert operator.pem --key operator.key "https://$CLIENT/health" 2>/dev/null |
    grep -q '"health":"true"'
}

if ! healthy; then
  mkdir -p "$DIR/data"
  chmod 700 "$DIR/data"
  setsid nohup etcd --name mesh-host-testbed-tls --data-dir "$DIR/data" \
    --listen-client-urls "https://$CLIENT" --advertise-client-urls "https://$CLIENT" \
    --cert-file "$DIR/server.pem" --key-file "$DIR/server.key" \
    --trusted-ca-file "$DIR/ca.pem" --client-cert-auth \
    --listen-peer-urls "http://$PEER" --initial-advertise-peer-urls "http://$PEER" \
    --initial-cluster "mesh-host-testbed-tls=http://$PEER" \
    >"$LOG" 2>&1 </dev/null &
  echo $! >"$DIR/etcd.pid"
  for _ in $(seq 1 100); do healthy && break; sleep 0.1; done
  healthy || { echo "51-etcd-tls.sh: etcd did not answer on https://$CLIENT; see $LOG" >&2; exit 1; }
fi
echo "etcd over TLS (client certificates) on https://$CLIENT, certificates in $DIR"
