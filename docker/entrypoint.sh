#!/bin/bash
# The image's entrypoint: `coordinator ARGS`, `worker ARGS`, `node ARGS` (the node agent,
# `latchkey node`: one worker per local rank), `latchkey ARGS` (the CLI), or any other command
# as is. The coordinator and the worker write their port file to $LATCHKEY_PORT_FILE (unless
# ARGS name --port-file), which healthcheck.sh reads; the node agent's ranks write theirs in its
# run folder instead (worker-R.port.json, which healthcheck.sh reads when the agent runs there;
# Kubernetes probes an agent's pod on its local rank 0's /metrics, deploy/k8s/base).
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
  node)
    shift
    exec latchkey node "$@"
    ;;
  latchkey)
    shift
    exec latchkey "$@"
    ;;
  ""|--help|-h|help)
    cat <<'USAGE'
usage: coordinator --db FILE [latchkey-coordinator flags]
       worker [latchkey-worker flags]      (settings also from the environment: docs/deploy.md)
       node --nproc N [latchkey node flags] [-- latchkey-worker flags]
                                           (the node agent: N workers, ranks K*N..K*N+N-1 for
                                           node rank K, default $JOB_COMPLETION_INDEX)
       latchkey COMMAND [flags]            (the CLI: submit, status, watch, ...)
       any other command, run as is
USAGE
    ;;
  *)
    exec "$@"
    ;;
esac
