#!/bin/bash
# The image's HEALTHCHECK (and the coordinator pod's readiness probe): healthy once the process
# has written its port file ($LATCHKEY_PORT_FILE: the coordinator after binding its ports, a
# worker once it has formed its groups and serves metrics) and the metrics port it names
# accepts connections; where that port speaks plain HTTP, GET /metrics must answer 200 (an
# HTTPS port, the coordinator's under TLS, is taken as serving once it accepts). A node agent's
# container (`node ...`) has no such file: its ranks write worker-R.port.json in the agent's run
# folder (the working folder unless --run-dir says otherwise) and it writes node-K.log there;
# it is healthy once a rank has written its file and every rank that has serves. (Kubernetes
# probes an agent's pod with httpGet on local rank 0's metrics port instead.)
set -uo pipefail

# Whether the port file $1 names a metrics port that serves (or no metrics port at all).
serving() {
  local port status=""
  port=$(sed -n 's/.*"metrics_port": *\(-\{0,1\}[0-9][0-9]*\).*/\1/p' "$1")
  if [ -z "$port" ] || [ "$port" -le 0 ]; then return 0; fi  # no metrics endpoint: the file is it
  exec 3<>"/dev/tcp/127.0.0.1/$port" || { echo "port $port refuses connections"; return 1; }
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  read -r -t 4 status <&3
  exec 3<&-
  case "$status" in
    "HTTP/1."?" 200"*) return 0 ;;
    HTTP/*) echo "port $port answered: $status"; return 1 ;;
    *) return 0 ;;  # not HTTP: a TLS port that accepted the connection
  esac
}

file="${LATCHKEY_PORT_FILE:-/run/latchkey/ports.json}"
if [ ! -s "$file" ] && compgen -G "node-*.log" >/dev/null; then
  shopt -s nullglob
  ranks=(worker-*.port.json)
  [ "${#ranks[@]}" -gt 0 ] || { echo "the node agent's ranks wrote no port file yet"; exit 1; }
  for f in "${ranks[@]}"; do
    [ -s "$f" ] && serving "$f" || { echo "$f: not serving"; exit 1; }
  done
  exit 0
fi
[ -s "$file" ] || { echo "no port file $file yet"; exit 1; }
serving "$file"
