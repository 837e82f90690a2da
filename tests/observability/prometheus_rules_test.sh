#!/bin/sh
# promtool on deploy/prometheus: both configs, the rule files, and the alerts' unit tests.
# Exit 77 (skipped) without promtool; a failure under CI=true.
set -u
dir=$1
if ! command -v promtool >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    echo "FAIL: promtool is not installed (Debian package prometheus); CI=true requires it"
    exit 1
  fi
  echo "SKIP: promtool is not installed (Debian package prometheus)"
  exit 77
fi
fail=0
promtool check rules "$dir"/rules/*.yml || fail=1
promtool test rules "$dir"/tests/*.yml || fail=1
promtool check config "$dir/prometheus-local.yml" || fail=1
out=$(promtool check config "$dir/prometheus.yml" 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  case "$out" in
    *"field kubernetes_sd_configs not found"*)
      # Debian builds Prometheus without Kubernetes service discovery. Check everything else
      # (relabelling, TLS, rule files) with the discovery block swapped for a static target.
      tmp=$(mktemp -d)
      cp -r "$dir/rules" "$tmp/"
      awk '/kubernetes_sd_configs:/ {print "    static_configs:"; print "      - targets: [\"127.0.0.1:9464\"]"; skip=1; next}
           skip && /^      - role:/ {next}
           {skip=0; print}' "$dir/prometheus.yml" > "$tmp/prometheus.yml"
      grep -q "role: pod" "$dir/prometheus.yml" || { echo "prometheus.yml: no pod discovery"; fail=1; }
      echo "this promtool has no kubernetes_sd_configs; checking the rest of prometheus.yml:"
      promtool check config "$tmp/prometheus.yml" || fail=1
      rm -rf "$tmp"
      ;;
    *) fail=1 ;;
  esac
fi
exit $fail
