#!/usr/bin/env bash
# Builds the CPU image (docker/Dockerfile), or with --cuda the GPU image (docker/cuda.Dockerfile),
# on a machine without a Docker daemon, a registry or a GPU (podman + buildah, chroot isolation)
# and smoke-tests it: inside the image a coordinator, two workers (ranks from
# JOB_COMPLETION_INDEX, as in a Kubernetes Indexed Job) and
# `latchkey submit --job-id --join-token-file` run a job with checkpoints to success, and the
# image's HEALTHCHECK command passes against the coordinator and a worker. The GPU image's smoke
# test first checks that ldd resolves every library of the worker (NCCL, the CUDA runtime and
# libtorch_cuda among them) and that a worker asked for `latchkey.device: "cuda"` without a GPU
# fails within 2 s with exit code 1, naming the missing device (the same message as this
# checkout's worker outside the image, when one built with CUDA is at LATCHKEY_BUILD_DIR).
#
# Usage: scripts/image.sh [--cuda] [--fast] [--ref GIT_REF] [--tag TAG]
#                        [--no-smoke | --smoke-only | --print-tag]
#   (default)  the full multi-stage build: the project is compiled inside the build stage
#   --cuda     the GPU image (default tag localhost/latchkey:cuda, the one the gpu overlay of
#              deploy/k8s names); always the full build (PyTorch's CUDA wheel, no --fast)
#   --fast     copy this checkout's binaries (LATCHKEY_BUILD_DIR, default build/; built without
#              CUDA) into the runtime stage instead (target runtime-prebuilt)
#   --ref REF  build from the files of a git commit instead of the working tree
#   --tag TAG  the image's name (default localhost/latchkey:cpu)
#   --smoke-only  no build: smoke-test the image TAG as it is
#   --print-tag   print the image's name and exit (the ctest docker_context compares it with
#                 the overlays of deploy/k8s)
# Needs root (podman, buildah and debootstrap are installed with apt when missing; the Debian 12
# base is bootstrapped once and tagged docker.io/library/debian:bookworm-slim, so the
# Dockerfile's FROM resolves without a registry).
#
# Measured on a 2-core machine shared with other builds and tests (Debian 12, podman 4.3):
#   base bootstrap (once)             3 min (debootstrap minbase + podman import)
#   --fast, new binaries              2.5 min build (package list, apt of ~250 runtime packages)
#                                     + 25 s smoke test; 35 s in all when the layers are cached
#   full multi-stage build            51 min cold (apt of the dev packages, then the compile
#                                     on 2 cores under heavy load, niced), 23 min with the
#                                     dev-package layer cached (--ref HEAD); + 10 s smoke test
#   image size                        1.18 GB both ways (Debian's libtorch 1.13 and the OpenCV,
#                                     FFmpeg and GDAL libraries it links are most of it); the
#                                     build stage 2.2 GB
#   --cuda, cold (base bootstrapped)  ~15 min: dev packages 35 s, the wheels 94 s (5.1 GB
#                                     installed), compile 8-10 min, runtime stage ~3 min;
#                                     10.5-13 min after a source change; image 4.2 GB, build
#                                     stage 10.2 GB; + 15 s smoke test (docs/deploy.md)
# CI does not run this script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fast=0
cuda=0
ref=""
tag=""
smoke=1
build_image=1
print_tag=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fast) fast=1 ;;
    --cuda) cuda=1 ;;
    --ref) ref=$2; shift ;;
    --tag) tag=$2; shift ;;
    --no-smoke) smoke=0 ;;
    --smoke-only) build_image=0 ;;
    --print-tag) print_tag=1 ;;
    *) echo "usage: scripts/image.sh [--cuda] [--fast] [--ref GIT_REF] [--tag TAG] [--no-smoke | --smoke-only | --print-tag]" >&2
       exit 2 ;;
  esac
  shift
done
dockerfile=docker/Dockerfile
if [ "$cuda" = 1 ]; then
  dockerfile=docker/cuda.Dockerfile
  tag=${tag:-localhost/latchkey:cuda}
  if [ "$fast" = 1 ]; then echo "image.sh: --fast is for the CPU image only" >&2; exit 2; fi
fi
tag=${tag:-localhost/latchkey:cpu}
if [ "$print_tag" = 1 ]; then echo "$tag"; exit 0; fi
say() { echo "image.sh: $*"; }
now() { date +%s; }

# --- tools and the base image -------------------------------------------------------------
missing=()
for t in podman buildah debootstrap; do command -v "$t" >/dev/null || missing+=("$t"); done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends podman buildah debootstrap
fi
base=docker.io/library/debian:bookworm-slim
if ! podman image exists "$base"; then
  t0=$(now)
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d /tmp/latchkey-rootfs.XXXXXX)
  say "bootstrapping Debian 12 from $mirror into $rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log"; exit 1; }
  tar -C "$rootfs" -c . | podman import - localhost/debian:bookworm-min
  podman tag localhost/debian:bookworm-min "$base"
  rm -rf "$rootfs" "$rootfs.log"
  say "base image ready in $(( $(now) - t0 )) s"
fi

context=$root
tmp_context=""
ctr=""
finish() {
  if [ -n "$ctr" ]; then buildah rm "$ctr" >/dev/null 2>&1 || true; fi
  if [ -n "$tmp_context" ]; then rm -rf "$tmp_context"; fi
}
trap finish EXIT
target=runtime
build_s=0
if [ "$build_image" = 1 ]; then
# --- the build context --------------------------------------------------------------------
if [ -n "$ref" ]; then
  context=$(mktemp -d /tmp/latchkey-context.XXXXXX)
  tmp_context=$context
  git -C "$root" archive "$ref" | tar -x -C "$context"
  say "context: $ref ($(git -C "$root" rev-parse --short "$ref"))"
fi
prebuilt=$context/docker/.prebuilt
rm -rf "$prebuilt"
mkdir -p "$prebuilt/bin"
if [ "$fast" = 1 ]; then
  build=${LATCHKEY_BUILD_DIR:-$root/build}
  bins=("$build/server/latchkey-coordinator" "$build/worker/latchkey-worker" "$build/client/latchkey")
  for b in "${bins[@]}"; do
    [ -x "$b" ] || { say "$b missing: build it first (scripts/build.sh)"; exit 1; }
    if ldd "$b" | grep -q 'libcudart\|libnccl'; then
      say "$b links CUDA: build with -DLATCHKEY_CUDA=OFF for the CPU image"; exit 1
    fi
  done
  cp "${bins[@]}" "$prebuilt/bin/"
  strip --strip-debug "$prebuilt"/bin/*
  bash "$root/docker/list-runtime-packages.sh" "$prebuilt"/bin/* > "$prebuilt/runtime-packages.txt"
  target=runtime-prebuilt
fi

# --- build --------------------------------------------------------------------------------
t0=$(now)
say "building $tag (target $target)"
extra=()
# pip inside the GPU image's build trusts what this machine trusts (a TLS-intercepting proxy).
ca=/etc/ssl/certs/ca-certificates.crt
if [ "$cuda" = 1 ] && [ -s "$ca" ]; then
  extra=(--build-arg PIP_CERT=/run/latchkey-host-ca.crt -v "$ca:/run/latchkey-host-ca.crt:ro")
fi
if [ "$cuda" = 1 ]; then
  # The build stage first, so that the runtime stage's cache knows which binaries it copies.
  podman build --pull=never --isolation chroot --network host --format docker \
    --ignorefile "$context/docker/Dockerfile.dockerignore" -f "$context/$dockerfile" \
    --target build --build-arg JOBS="${LATCHKEY_IMAGE_JOBS:-2}" "${extra[@]}" \
    -t "$tag-build-stage" "$context"
  extra+=(--build-arg "BUILD_STAGE_ID=$(podman image inspect --format '{{.Id}}' "$tag-build-stage")")
fi
podman build --pull=never --isolation chroot --network host --format docker \
  --ignorefile "$context/docker/Dockerfile.dockerignore" -f "$context/$dockerfile" \
  --target "$target" --build-arg JOBS="${LATCHKEY_IMAGE_JOBS:-2}" "${extra[@]}" -t "$tag" "$context"
build_s=$(( $(now) - t0 ))
rm -rf "$prebuilt"
fi
size=$(podman image inspect --format '{{.Size}}' "$tag")
health=$(podman image inspect --format '{{json .Config.Healthcheck}}' "$tag")
case "$health" in *healthcheck.sh*) ;; *) say "the image has no HEALTHCHECK: $health"; exit 1 ;; esac
say "built $tag in ${build_s} s, $(( size / 1000000 )) MB; HEALTHCHECK $health"
[ "$smoke" = 1 ] || exit 0

# --- smoke test: a job to success inside the image ----------------------------------------
t0=$(now)
ctr=$(buildah from --pull=never "$tag")
if [ "$cuda" = 1 ]; then
  # Every library of the worker resolves, and the CUDA ones are those of the image.
  # shellcheck disable=SC2016
  buildah run --isolation chroot "$ctr" -- /bin/bash -c '
    set -euo pipefail
    out=$(ldd /opt/latchkey/bin/latchkey-worker)
    if grep "not found" <<<"$out"; then echo "smoke: the worker misses libraries"; exit 1; fi
    for lib in libnccl.so libcudart.so libtorch_cuda.so libc10_cuda.so libtorch_cpu.so libgloo.so; do
      line=$(grep -m1 "$lib" <<<"$out") || { echo "smoke: the worker does not load $lib"; exit 1; }
      echo "smoke: ldd: ${line#"${line%%[![:space:]]*}"}"
    done
    for bin in /opt/latchkey/bin/*; do
      if ldd "$bin" | grep "not found"; then echo "smoke: $bin misses libraries"; exit 1; fi
    done
    echo "smoke: ldd resolves all $(wc -l <<<"$out") libraries of the worker (and of every binary)"
  ' || { say "smoke test failed (ldd)"; exit 1; }
  # A worker asked for cuda on a machine without a GPU fails at once, naming the device.
  # shellcheck disable=SC2016  # expanded by the bash that runs it: $1 port, $2 worker, $3 dir
  no_gpu='
    cd "${3:-/var/lib/latchkey}"
    cat > cuda-spec.json <<SPEC
{
  "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 4,
            "vocab_size": 256, "n_positions": 64, "multi_query": true},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
  "tensor_parallel": {"autotp_size": 1},
  "latchkey": {"seq_len": 32, "steps": 2, "seed": 1, "world_size": 1, "device": "cuda",
               "backend": "nccl", "data": {"synthetic": {"seed": 1}}}
}
SPEC
    start=$(date +%s%N)
    RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 \
      ${2:-latchkey-worker} --standalone --spec cuda-spec.json --quiet 2> cuda-worker.err
    code=$?
    echo "exit $code in $(( ($(date +%s%N) - start) / 1000000 )) ms: $(tail -1 cuda-worker.err)"'
  port=$(( 20000 + RANDOM % 20000 ))
  inside=$(buildah run --isolation chroot --network host "$ctr" -- /bin/bash -c "$no_gpu" _ "$port")
  echo "smoke: inside the image: $inside"
  [[ "$inside" =~ ^exit\ 1\ in\ ([0-9]+)\ ms:\ (.*)$ ]] || { say "smoke test failed (cuda)"; exit 1; }
  ms=${BASH_REMATCH[1]}
  msg=${BASH_REMATCH[2]}
  expected='latchkey-worker: latchkey.device: "cuda": no CUDA device cuda:0 for this rank: cudaGetDeviceCount: '
  if [ "${msg#"$expected"}" = "$msg" ] || [ "$ms" -ge 2000 ]; then
    say "smoke test failed: expected exit 1 within 2000 ms with \"$expected...\""; exit 1
  fi
  host_worker=${LATCHKEY_BUILD_DIR:-$root/build}/worker/latchkey-worker
  if [ -x "$host_worker" ] && ldd "$host_worker" | grep -q libcudart; then
    work=$(mktemp -d /tmp/latchkey-nogpu.XXXXXX)
    outside=$(bash -c "$no_gpu" _ "$(( port + 1 ))" "$host_worker" "$work")
    rm -rf "$work"
    echo "smoke: outside, $host_worker: $outside"
    [ "${outside#exit 1 in * ms: }" = "$msg" ] ||
      { say "smoke test failed: the image's worker and this checkout's disagree"; exit 1; }
  fi
  echo "smoke: the cuda worker fails in $ms ms with exit 1, naming the missing device"
fi
port_base=$(( 20000 + RANDOM % 20000 ))
buildah run --isolation chroot --network host "$ctr" -- /bin/bash -c "
set -euo pipefail
cd /var/lib/latchkey
echo \"smoke: running as \$(id -un) (uid \$(id -u))\"
cat > spec.json <<'SPEC'
{
  \"model\": {\"model_type\": \"gpt_bigcode\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4,
            \"vocab_size\": 256, \"n_positions\": 64, \"multi_query\": true},
  \"train_micro_batch_size_per_gpu\": 2,
  \"gradient_accumulation_steps\": 2,
  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},
  \"tensor_parallel\": {\"autotp_size\": 2},
  \"latchkey\": {\"seq_len\": 32, \"steps\": 8, \"seed\": 1, \"world_size\": 2,
               \"backend\": \"gloo\", \"data\": {\"synthetic\": {\"seed\": 1}},
               \"checkpoint\": {\"dir\": \"/checkpoints/smoke\", \"every_steps\": 4, \"keep\": 2}}
}
SPEC
printf '%s' smoke-join-token > join-token
entrypoint.sh coordinator --listen 127.0.0.1:0 --db /var/lib/latchkey/smoke.db \
  --metrics-host 127.0.0.1 --metrics-port 0 --data-root /checkpoints \
  --rendezvous-ports $port_base-$((port_base + 50)) > coordinator.log 2>&1 &
coord=\$!
for i in \$(seq 1 100); do [ -s \"\$LATCHKEY_PORT_FILE\" ] && break; sleep 0.2; done
healthcheck.sh
grpc=\$(sed -n 's/.*\"grpc_port\": *\([0-9]*\).*/\1/p' \"\$LATCHKEY_PORT_FILE\")
export LATCHKEY_COORDINATOR=127.0.0.1:\$grpc LATCHKEY_JOB_ID=smoke
latchkey submit spec.json --join-token-file join-token
pids=()
for r in 0 1; do
  JOB_COMPLETION_INDEX=\$r LATCHKEY_JOIN_TOKEN=smoke-join-token LATCHKEY_PORT_FILE=/run/latchkey/worker-\$r.json \
    LATCHKEY_DATA_ROOTS=/checkpoints entrypoint.sh worker --metrics-host 127.0.0.1 --metrics-port 0 \
    --linger-seconds 4 > worker-\$r.log 2>&1 &
  pids+=(\$!)
done
for i in \$(seq 1 300); do [ -s /run/latchkey/worker-1.json ] && break; sleep 0.2; done
LATCHKEY_PORT_FILE=/run/latchkey/worker-1.json healthcheck.sh
grep -Eq '\"rank\":1[,}]' /run/latchkey/worker-1.json || { echo 'smoke: worker 1 is not rank 1'; exit 1; }
echo 'smoke: the health check passes for the coordinator and a worker'
# The same submit again: the same job, followed to its end (exit 0 when it succeeded).
latchkey submit spec.json --join-token-file join-token --watch --watch-timeout 300 | tail -3
for p in \"\${pids[@]}\"; do wait \$p; done
ls /checkpoints/smoke
kill \$coord; wait \$coord || true
echo 'smoke: job smoke succeeded inside the image'
" || { say "smoke test failed"; buildah run --isolation chroot "$ctr" -- /bin/bash -c \
        'tail -n 30 /var/lib/latchkey/*.log' || true; exit 1; }
if [ "$cuda" = 1 ]; then
  # The GPU check runs in the build stage against the bundle the runtime stage ships: the same
  # worker, byte for byte; here, without a GPU, its CPU dry run (docs/deploy.md).
  shipped=$(buildah run --isolation chroot "$ctr" -- sha256sum /opt/latchkey/bin/latchkey-worker)
  bctr=$(buildah from --pull=never "$tag-build-stage")
  bundled=$(buildah run --isolation chroot "$bctr" -- \
    sha256sum /opt/bundle/opt/latchkey/bin/latchkey-worker)
  if [ "${shipped%% *}" != "${bundled%% *}" ]; then
    say "smoke test failed: the build stage's bundle and the image hold different workers"
    buildah rm "$bctr" >/dev/null; exit 1
  fi
  echo "smoke: the build stage's bundle holds the image's worker (sha256 ${shipped:0:16}...)"
  if ! buildah run --isolation chroot "$bctr" -- /bin/bash -c '
      cd /src && PYTHON=/opt/torch/bin/python3 OUT=/tmp/gpu-check \
        bash scripts/gpu-check.sh --cpu-dry-run --worker /opt/bundle/opt/latchkey/bin/latchkey-worker \
        > /tmp/gpu-check.log 2>&1 || { tail -n 40 /tmp/gpu-check.log; exit 1; }
      tail -n 12 /tmp/gpu-check.log'; then
    say "smoke test failed: gpu-check.sh --cpu-dry-run in the build stage"
    buildah rm "$bctr" >/dev/null; exit 1
  fi
  buildah rm "$bctr" >/dev/null
  echo "smoke: gpu-check.sh --cpu-dry-run passes in the build stage ($tag-build-stage)"
fi
say "smoke test passed in $(( $(now) - t0 )) s"
say "summary: $tag target $target: build ${build_s} s, size $(( size / 1000000 )) MB"
