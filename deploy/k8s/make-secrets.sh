#!/usr/bin/env bash
# Makes the job's credentials and the three Secrets of deploy/k8s/base/secrets.yaml from them:
#   a submit token and an admin token (the coordinator's --auth-tokens file keeps only their
#   SHA-256), a join token, a CA and the coordinator's certificate for the Service's names.
# Usage: deploy/k8s/make-secrets.sh OUT_DIR [NAMESPACE]     (NAMESPACE default: default)
# Writes OUT_DIR/{auth,join,tls}/... (mode 0600) and OUT_DIR/secrets.yaml; apply that file
# (kubectl apply -n NAMESPACE -f OUT_DIR/secrets.yaml) before the overlay, and keep the admin
# token (OUT_DIR/auth/admin-token) for the CLI. Needs openssl and sha256sum.
# LATCHKEY_EXTRA_SANS: more subjectAltName entries for the certificate, e.g. DNS:coord.example.
set -euo pipefail
out=${1:?usage: make-secrets.sh OUT_DIR [NAMESPACE]}
ns=${2:-default}
service=latchkey-coordinator
umask 077
mkdir -p "$out/auth" "$out/join" "$out/tls"

token() { openssl rand -hex 32; }
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

submit=$(token)
admin=$(token)
# No newline after a token: a Secret key reaches the pod's environment byte for byte.
printf '%s' "$submit" > "$out/auth/submit-token"
printf '%s' "$admin" > "$out/auth/admin-token"
{
  echo "# ROLE NAME SHA256HEX (docs/protocol.md, Security)"
  echo "submit deploy $(sha "$submit")"
  echo "admin operator $(sha "$admin")"
} > "$out/auth/auth-tokens"
printf '%s' "$(token)" > "$out/join/join-token"

sans="DNS:$service,DNS:$service.$ns,DNS:$service.$ns.svc,DNS:$service.$ns.svc.cluster.local"
# localhost and 127.0.0.1: `kubectl port-forward svc/latchkey-coordinator 50051` from a laptop.
sans="$sans,DNS:localhost,IP:127.0.0.1${LATCHKEY_EXTRA_SANS:+,$LATCHKEY_EXTRA_SANS}"
(
  cd "$out/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 \
    -subj /CN=latchkey-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj "/CN=$service" \
    2>/dev/null
  printf 'subjectAltName=%s\n' "$sans" > tls.ext
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt \
    -days 365 -extfile tls.ext 2>/dev/null
  rm -f tls.csr tls.ext ca.srl
)

{
  kubectl create secret generic latchkey-auth --dry-run=client -o yaml \
    --from-file=auth-tokens="$out/auth/auth-tokens" --from-file=submit-token="$out/auth/submit-token"
  echo "---"
  kubectl create secret generic latchkey-join --dry-run=client -o yaml \
    --from-file=join-token="$out/join/join-token"
  echo "---"
  kubectl create secret generic latchkey-tls --type=kubernetes.io/tls --dry-run=client -o yaml \
    --from-file=tls.crt="$out/tls/tls.crt" --from-file=tls.key="$out/tls/tls.key" \
    --from-file=ca.crt="$out/tls/ca.crt"
} > "$out/secrets.yaml"
echo "make-secrets: wrote $out (apply $out/secrets.yaml; admin token in $out/auth/admin-token)"
