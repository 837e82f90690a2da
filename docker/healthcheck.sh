#!/bin/bash
# The image's HEALTHCHECK (and the coordinator pod's readiness probe): healthy once the process
# has written its port file ($LATCHKEY_PORT_FILE: the coordinator after binding its ports, a
# worker once it has formed its groups and serves metrics) and the metrics port it names
# accepts connections; where that port speaks plain HTTP, GET /metrics must answer 200 (an
# HTTPS port, the coordinator's under TLS, is taken as serving once it accepts).
set -uo pipefail
file="${LATCHKEY_PORT_FILE:-/run/latchkey/ports.json}"
[ -s "$file" ] || { echo "no port file $file yet"; exit 1; }
port=$(sed -n 's/.*"metrics_port": *\(-\{0,1\}[0-9][0-9]*\).*/\1/p' "$file")
if [ -z "$port" ] || [ "$port" -le 0 ]; then exit 0; fi  # no metrics endpoint: the file is it
exec 3<>"/dev/tcp/127.0.0.1/$port" || { echo "port $port refuses connections"; exit 1; }
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
status=""
read -r -t 4 status <&3
case "$status" in
  "HTTP/1."?" 200"*) exit 0 ;;
  HTTP/*) echo "port $port answered: $status"; exit 1 ;;
  *) exit 0 ;;  # not HTTP: a TLS port that accepted the connection
esac
