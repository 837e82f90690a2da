#!/usr/bin/env bash
# Installs every Debian package latchkey's build, tests and demo need (Debian 12).
# Idempotent: packages already present are skipped by apt.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git clang-format
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libsqlite3-dev nlohmann-json3-dev libcli11-dev
  libcpp-httplib-dev
  clang libclang-rt-14-dev llvm
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  prometheus python3-grpcio python3-grpc-tools python3-torch python3-venv python3-yaml openssl
  chromium curl
  iproute2 util-linux
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# kubectl renders the Kubernetes overlays in the deploy tests. Debian 12's kubernetes-client
# (1.20) cannot render them (kustomize v5 features): a current kubectl (>= 1.27) must be on PATH.
# In CI (CI=true) its absence is an error here already; elsewhere those two tests skip.
kubectl_minor=$(kubectl version --client -o json 2>/dev/null |
  sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1)
if [ -z "$kubectl_minor" ] || [ "$kubectl_minor" -lt 27 ]; then
  msg="setup: kubectl >= 1.27 is not on PATH (found: ${kubectl_minor:+1.$kubectl_minor}${kubectl_minor:-none})"
  if [ "${CI:-}" = true ]; then
    echo "$msg; CI=true requires it (https://kubernetes.io/docs/tasks/tools/)" >&2
    exit 1
  fi
  echo "$msg: the two Kubernetes render tests will skip"
else
  echo "setup: kubectl 1.$kubectl_minor"
fi

# The pinned Python venv of scripts/prepare-data and of the Hugging Face tests
# (scripts/hf-venv.sh, from PyPI). The demo makes it on first use; in CI (CI=true) it is made
# here, and a failure to make it is an error, so the tests that need it never find it missing.
if [ "${CI:-}" = true ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  bash "$root/scripts/hf-venv.sh" "${LATCHKEY_HF_VENV:-$root/build/hf-venv}"
  # The TensorBoard test's venv (scripts/tensorboard-venv.sh, tests/tensorboard/).
  bash "$root/scripts/tensorboard-venv.sh" \
    "${LATCHKEY_TENSORBOARD_VENV:-$root/build/tensorboard-venv}"
fi
