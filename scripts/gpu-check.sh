#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md): on a machine with an NVIDIA GPU and a CUDA PyTorch 2.x,
# in under 6 minutes, with no network:
#   probe      what the machine has (GPU, driver, torch, compilers, CUDA/NCCL, C++ libraries)
#   build      the core-only CUDA worker against the installed torch (LATCHKEY_CORE_ONLY=ON
#              -DLATCHKEY_CUDA=ON, Torch_DIR from torch.utils.cmake_prefix_path, no -Werror)
#   nccl       the NCCL backend for real on a one-rank communicator and, with two GPUs, a
#              two-rank one (latchkey-nccl-check --self-test: every collective and dtype issued
#              on device buffers, checked against the host's results)
#   numerics   every one-rank fixture run and a 6-step TP 1 run on cuda against the CPU numbers
#              of the same binary (fp32, TF32 off): every step's loss and grad norm within
#              1e-4; each device's distance to the fixture (an independent float64 run) printed
#   agent      the node agent as a GPU pod runs it: a coordinator on loopback, `latchkey submit`
#              and `latchkey node --nproc N` with N = the GPUs here (nvidia-smi -L), a small
#              job on NCCL/cuda (TP N where the heads divide, else 1); passes when the agent
#              and the job succeed and every rank's steps-R.jsonl holds every step. Needs the
#              full build's latchkey, latchkey-coordinator and a worker that joins a
#              coordinator: the core-only build has none of these (then: skipped, saying so)
#   latchkey   tokens/s and MFU of a ~350M-parameter GPTBigCode MQA, seq 1024, bf16, TP 1
#   memory     that model at seq 2048: peak and activation memory and tokens/s without and with
#              selective recomputation at TP 1, and with two GPUs at TP 2 with sequence
#              parallelism (OUT/memory/memory-table.md); one GPU: the TP 2 runs are not made
#   peer       the same model and step in plain PyTorch eager (bench/peer/gpu_peer.py)
# Each stage writes OUT/stage-NAME.json as it finishes (a cut-off run still reports what it got)
# and the table of every stage is printed at the end (OUT/table.txt), with the latchkey/peer
# throughput ratio. OUT is $OUT when set, else ./gpu-check-out.
#
#   scripts/gpu-check.sh                     the whole check
#   scripts/gpu-check.sh --cpu-dry-run [--worker BIN]
#       the stages that need no GPU (probe, the CPU half of the numerics with BIN, the agent
#       stage on the CPU: 2 ranks, TP 2, shm, 4 steps; the peer on a tiny model on the CPU, the
#       table); the GPU stages are reported as skipped. BIN: an already built latchkey-worker
#       (the build stage is skipped).
#   --bin-dir DIR: where the agent stage finds latchkey and latchkey-coordinator: DIR or its
#       client/ and server/ (a build folder; default $root/build), else beside BIN (an image's
#       bin/ folder) or in BIN's build folder.
# LATCHKEY_CMAKE_ARGS: extra arguments for the build stage's cmake (e.g.
# -DLATCHKEY_USE_CARRIED_DEPS=ON to build with .deps/ on a machine that has the packages).
# LATCHKEY_FIXTURE_TOL: the CPU-only numerics' tolerance to the fixture (default 1e-5, the CPU
# parity tests'); the dry-run test sets it impossibly tight to show the stage can fail.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
dry=0
worker=""
bin_dir="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) dry=1 ;;
    --worker) worker=$2; shift ;;
    --bin-dir) bin_dir=$2; shift ;;
    *) echo "usage: gpu-check.sh [--cpu-dry-run] [--worker BIN] [--bin-dir DIR]" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
fixture_tol=${LATCHKEY_FIXTURE_TOL:-1e-5}
start_all=$(date +%s)
helper="$root/scripts/gpu_check_report.py"

# stage NAME STATUS SECONDS SUMMARY [DETAIL_FILE]: records one stage's result.
stage() {
  "$py" "$helper" record "$out" "$1" "$2" "$3" "$4" "${5:-}"
}
# run_stage NAME LIMIT_S CMD...: runs CMD with a time limit, its output in OUT/NAME.log.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout --signal=KILL "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo $(( $(date +%s) - t0 ))
  return $rc
}

# --- probe ---------------------------------------------------------------------------------
t0=$(date +%s)
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -srm)"
  echo "cpus: $(nproc)"
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    sed 's/^/gpu: /' || echo "gpu: no nvidia-smi"
  for t in cmake ninja g++ c++ nvcc ccache git; do
    echo "tool $t: $(command -v $t >/dev/null && "$t" --version 2>&1 | head -1 || echo absent)"
  done
  "$py" - <<'PY' 2>&1
import importlib.util
print("python:", __import__("sys").version.split()[0])
if importlib.util.find_spec("torch") is None:
    print("torch: absent")
else:
    import torch, torch.utils
    print("torch:", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available(),
          "devices", torch.cuda.device_count() if torch.cuda.is_available() else 0)
    print("torch cmake prefix:", torch.utils.cmake_prefix_path)
    try:
        print("torch nccl:", ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as e:  # noqa: BLE001
        print("torch nccl: n/a", e)
PY
  for h in nccl.h cuda_runtime_api.h absl/status/status.h nlohmann/json.hpp CLI/CLI.hpp \
           gloo/context.h gtest/gtest.h openssl/sha.h; do
    found=$(find /usr/local/cuda/include /usr/include /usr/local/include /opt \
      "$("$py" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" \
      -path "*/$h" -print -quit 2>/dev/null)
    echo "header $h: ${found:-absent}"
  done
  # What scripts/gpu-deps.sh carried (used by the build where nothing is installed).
  if [ -f "$root/.deps/MANIFEST" ]; then
    sed 's/^/carried: /' "$root/.deps/MANIFEST"
  else
    echo "carried: none (.deps/ absent: run scripts/gpu-deps.sh where there is network)"
  fi
  for l in libnccl.so libcudart.so libabsl_status.so libgloo.so libssl.so libcrypto.so; do
    found=$(ldconfig -p 2>/dev/null | awk -v l="$l" '$1 ~ l {print $NF; exit}')
    [ -z "$found" ] && found=$(find /usr/local/cuda /usr/lib /opt \
      "$("$py" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" \
      -name "$l*" -print -quit 2>/dev/null)
    echo "library $l: ${found:-absent}"
  done
} >"$out/probe.txt" 2>&1
gpu=$(grep -m1 '^gpu: ' "$out/probe.txt" | cut -d' ' -f2-)
stage probe ok $(( $(date +%s) - t0 )) "${gpu:-no gpu}" "$out/probe.txt"
have_gpu=0
grep -q 'available True' "$out/probe.txt" && have_gpu=1
[ "$dry" = 1 ] && have_gpu=0

# --- build ---------------------------------------------------------------------------------
if [ -n "$worker" ]; then
  stage build skipped 0 "given --worker $worker"
elif [ "$dry" = 1 ]; then
  stage build skipped 0 "--cpu-dry-run without --worker"
else
  build="$out/build"
  torch_dir=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  # The torch folder itself too, so its lib/ is searched before any system libtorch.
  torch_root=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  # A pip CUDA PyTorch brings NCCL as site-packages/nvidia/nccl (headers and libnccl.so.2).
  if [ -z "${NCCL_ROOT:-}" ]; then
    NCCL_ROOT=$("$py" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    export NCCL_ROOT
  fi
  secs=$(run_stage build 240 bash -c "
    cmake -S '$root' -B '$build' -G \$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles') \
      -DCMAKE_BUILD_TYPE=Release -DLATCHKEY_CORE_ONLY=ON -DLATCHKEY_CUDA=ON \
      -DLATCHKEY_WERROR=OFF -DLATCHKEY_BUILD_TESTS=OFF -DLATCHKEY_BUILD_BENCH=OFF \
      -DCMAKE_PREFIX_PATH='$torch_dir;$torch_root' ${LATCHKEY_CMAKE_ARGS:-} &&
    cmake --build '$build' -j$(nproc) --target latchkey-worker latchkey-nccl-check")
  rc=$?
  if [ $rc = 0 ]; then
    worker="$build/worker/latchkey-worker"
    stage build ok "$secs" "core-only CUDA worker" "$out/build.log"
  else
    stage build failed "$secs" "$(grep -m1 -E 'Error|error:|Could not find' "$out/build.log")" \
      "$out/build.log"
  fi
fi
nccl_check=""
# Beside the worker in a build folder, or in the same bin/ folder (the CUDA image's bundle).
if [ -n "$worker" ]; then
  nccl_check="$(dirname "$worker")/comm/nccl/latchkey-nccl-check"
  [ -x "$nccl_check" ] || nccl_check="$(dirname "$worker")/latchkey-nccl-check"
fi

# --- nccl self-test -------------------------------------------------------------------------
if [ "$have_gpu" = 0 ]; then
  stage nccl skipped 0 "no CUDA device"
elif [ ! -x "$nccl_check" ]; then
  stage nccl skipped 0 "no latchkey-nccl-check (build failed)"
else
  secs=$(run_stage nccl 60 "$nccl_check" --self-test)
  rc=$?
  st=failed; [ $rc = 0 ] && st=ok
  stage nccl $st "$secs" "$(tail -1 "$out/nccl.log")" "$out/nccl.log"
fi

# --- numerics: the fixture runs and the 6-step run, cpu and cuda, from the same binary ---------
if [ -z "$worker" ] || [ ! -x "$worker" ]; then
  stage numerics skipped 0 "no latchkey-worker"
else
  secs=$(run_stage numerics-cpu 120 "$py" "$helper" run-numerics "$worker" "$root" cpu \
    "$out/numerics-cpu")
  rc=$?
  if [ $rc != 0 ]; then
    stage numerics failed "$secs" "cpu run: $(tail -1 "$out/numerics-cpu.log")"
  elif [ "$have_gpu" = 0 ]; then
    # The CPU half alone: its fixture runs within the CPU parity tests' 1e-5 of the fixture.
    gap=$("$py" "$helper" fixture-gap "$root" "$out/numerics-cpu/fixture" "$fixture_tol")
    rcg=$?
    st=skipped; [ $rcg = 0 ] || st=failed
    stage numerics $st "$secs" "cpu half only: $("$py" "$helper" summarize-steps \
      "$out/numerics-cpu/steps-0.jsonl"); $gap"
  else
    secs2=$(run_stage numerics-cuda 120 "$py" "$helper" run-numerics "$worker" "$root" cuda \
      "$out/numerics-cuda")
    rc=$?
    if [ $rc != 0 ]; then
      stage numerics failed "$((secs + secs2))" "cuda run: $(tail -1 "$out/numerics-cuda.log")"
    else
      six=$("$py" "$helper" compare-steps "$out/numerics-cpu/steps-0.jsonl" \
        "$out/numerics-cuda/steps-0.jsonl" 1e-4)
      rc6=$?
      runs=$("$py" "$helper" compare-fixture-runs "$root" "$out/numerics-cpu/fixture" \
        "$out/numerics-cuda/fixture" 1e-4)
      rcf=$?
      st=failed; [ $rc6 = 0 ] && [ $rcf = 0 ] && st=ok
      stage numerics $st "$((secs + secs2))" "$six; $runs"
    fi
  fi
fi

# --- agent: one node of the gpu overlay's pods, `latchkey node` under a local coordinator -----
# find_bin NAME SUBDIR: NAME in --bin-dir (or its SUBDIR), beside the worker, or in the worker's
# build folder (build/worker/latchkey-worker -> build/SUBDIR/NAME).
find_bin() {
  local d
  for d in "$bin_dir" "$bin_dir/$2" ${worker:+"$(dirname "$worker")"} \
           ${worker:+"$(dirname "$worker")/../$2"}; do
    if [ -x "$d/$1" ]; then echo "$d/$1"; return 0; fi
  done
  return 1
}
gpus=0
[ "$have_gpu" = 1 ] && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
cli=$(find_bin latchkey client)
coordinator=$(find_bin latchkey-coordinator server)
if [ "$dry" = 0 ] && [ "$have_gpu" = 0 ]; then
  stage agent skipped 0 "no CUDA device"
elif [ -z "$worker" ] || [ ! -x "$worker" ]; then
  stage agent skipped 0 "no latchkey-worker"
elif [ -z "$cli" ] || [ -z "$coordinator" ]; then
  stage agent skipped 0 "no latchkey CLI or latchkey-coordinator in $bin_dir or beside \
$worker (the core-only build has neither: pass --bin-dir of a full build, or run in the CUDA \
image's build stage)"
elif [[ "$(env -u LATCHKEY_JOB_ID -u LATCHKEY_COORDINATOR timeout 60 "$worker" 2>&1)" == \
      *"only --standalone mode"* ]]; then
  stage agent skipped 0 "$worker is a core-only build (standalone only): the agent's ranks \
join a coordinator; pass --worker of a full CUDA build"
elif ! "$cli" node --help >/dev/null 2>&1; then
  stage agent failed 0 "$cli has no \`node\` command"
else
  device=cuda ranks=$gpus
  [ "$have_gpu" = 0 ] && device=cpu ranks=2
  dir="$out/agent"
  rm -rf "$dir" && mkdir -p "$dir"
  secs=$(run_stage agent 300 "$py" "$helper" run-agent "$worker" "$cli" "$coordinator" \
    "$device" "$ranks" "$dir")
  rc=$?
  st=failed
  if [ $rc = 0 ]; then
    st=ok
    [ "$have_gpu" = 0 ] && st="dry-run"  # the CPU: the agent's process handling, not NCCL
  fi
  stage agent $st "$secs" "$(tail -1 "$out/agent.log")" "$out/agent.log"
fi

# --- throughput: latchkey and the peer --------------------------------------------------------
if [ "$have_gpu" = 0 ] || [ -z "$worker" ]; then
  stage latchkey skipped 0 "no CUDA device or no worker"
else
  dir="$out/throughput"
  mkdir -p "$dir"
  secs=$(run_stage latchkey 150 "$py" "$helper" run-throughput "$worker" cuda "$dir")
  rc=$?
  st=failed; [ $rc = 0 ] && st=ok
  stage latchkey $st "$secs" "$("$py" "$helper" throughput "$dir/steps-0.jsonl" latchkey \
    "$out/probe.txt")" "$out/latchkey.log"
fi
# --- memory: recomputation and sequence parallelism at seq 2048 --------------------------------
if [ -z "$worker" ] || [ ! -x "$worker" ]; then
  stage memory skipped 0 "no latchkey-worker"
else
  device=cuda; [ "$have_gpu" = 0 ] && device=cpu
  dir="$out/memory"
  mkdir -p "$dir"
  secs=$(run_stage memory 180 "$py" "$helper" run-memory "$worker" "$device" "$dir" "$gpus")
  rc=$?
  summary=$("$py" "$helper" memory "$dir" "$device" "$gpus")
  rcm=$?
  st=failed
  if [ $rc = 0 ] && [ $rcm = 0 ]; then
    st=ok
    [ "$have_gpu" = 0 ] && st=dry-run  # a tiny model on the CPU: the fields and modes only
    [ "$have_gpu" = 1 ] && [ "$gpus" -lt 2 ] && summary="$summary; TP 2 + SP not run (one GPU)"
  fi
  stage memory $st "$secs" "$summary" "$dir/memory-table.md"
fi

if [ "$have_gpu" = 1 ]; then
  secs=$(run_stage peer 150 "$py" "$root/bench/peer/gpu_peer.py")
else
  secs=$(run_stage peer 120 "$py" "$root/bench/peer/gpu_peer.py" --cpu-dry-run)
fi
rc=$?
st=failed; [ $rc = 0 ] && st=ok
[ "$have_gpu" = 0 ] && [ $rc = 0 ] && st=dry-run
stage peer $st "$secs" "$("$py" "$helper" peer "$out/peer.log")" "$out/peer.log"

"$py" "$helper" table "$out" $(( $(date +%s) - start_all )) | tee "$out/table.txt"
grep -q '| failed ' "$out/table.txt" && exit 1
exit 0
