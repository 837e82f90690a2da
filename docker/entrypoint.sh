#!/bin/bash
# The image's entrypoint: `coordinator ARGS`, `worker ARGS`, `latchkey ARGS` (the CLI), or any
# other command as is. The coordinator and the worker write their port file to
# $LATCHKEY_PORT_FILE (unless ARGS name --port-file), which healthcheck.sh reads.
set -euo pipefail

with_port_file() {
  local a
  for a in "$@"; do
    if [ "$a" = "--port-file" ]; then return 1; fi
  done
  [ -n "${LATCHKEY_PORT_FILE:-}" ]
}

case "${1:-}" in
  coordinator)
    shift
    if with_port_file "$@"; then set -- --port-file "$LATCHKEY_PORT_FILE" "$@"; fi
    exec latchkey-coordinator "$@"
    ;;
  worker)
    shift
    if with_port_file "$@"; then set -- --port-file "$LATCHKEY_PORT_FILE" "$@"; fi
    exec latchkey-worker "$@"
    ;;
  latchkey)
    shift
    exec latchkey "$@"
    ;;
  ""|--help|-h|help)
    cat <<'USAGE'
usage: coordinator --db FILE [latchkey-coordinator flags]
       worker [latchkey-worker flags]      (settings also from the environment: docs/deploy.md)
       latchkey COMMAND [flags]            (the CLI: submit, status, watch, ...)
       any other command, run as is
USAGE
    ;;
  *)
    exec "$@"
    ;;
esac
