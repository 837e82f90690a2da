// Resumable training checkpoints of a TrainingState: this rank's file, the confirmation of every
// rank's file over the world group, rank 0's commit, and loading after verification.
#include "worker/checkpoint/checkpointer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <vector>

#include "common/crash_point.h"
#include "common/status_macros.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/tensor_bytes.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/process_groups.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"
#include "worker/train/flat_ops.h"
#include "worker/train/optimizer.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

// A SHA-256 as it travels between ranks: its 64 hex characters, as bytes.
constexpr int kDigestBytes = 64;
// The confirmation record of one rank: ok (1 byte), the file's size (int64, host order: every
// rank of a job runs one build), the file's SHA-256.
constexpr int kSizeAt = 1;
constexpr int kDigestAt = kSizeAt + 8;
constexpr int kRecord = kDigestAt + kDigestBytes;
// Rank 0's commit outcome: ok (1 byte), the manifest's SHA-256.
constexpr int kOutcome = 1 + kDigestBytes;

void PutDigest(const std::string& hex, uint8_t* out) {
  std::memcpy(out, hex.data(), std::min<size_t>(hex.size(), kDigestBytes));
}
std::string GetDigest(const uint8_t* in) {
  return std::string(reinterpret_cast<const char*>(in), kDigestBytes);
}

// All-gathers n host bytes over the world into out (world_size * n), or broadcasts them from
// rank 0 (out == values), through uint8 buffers on the training device (collectives take
// device-tagged buffers only).
absl::Status ExchangeBytes(const TrainingState& s, uint8_t* values, int64_t n, uint8_t* out,
                           bool gather) {
  const comm::ProcessGroups& g = *s.groups;
  at::Tensor in = at::from_blob(values, {n}, at::kByte).to(s.params->device());
  at::Tensor t = gather ? at::empty({n * g.world_size}, in.options()) : in;
  LK_RETURN_IF_ERROR(gather ? g.world->AllGather(CommBuffer(in), CommBuffer(t))
                            : g.world->Broadcast(CommBuffer(t), 0));
  if (!t.is_cpu() || gather) std::memcpy(out, t.cpu().data_ptr<uint8_t>(), t.numel());
  return absl::OkStatus();
}

// This rank's file of a checkpoint after window `step` (docs/fault-tolerance.md).
StFile RankState(const TrainingState& s, int64_t step) {
  const comm::ProcessGroups& g = *s.groups;
  ParamStore& store = *s.params;
  StFile f;
  const at::Tensor& flat = s.bf16() ? store.flat_compute() : store.flat_params();
  // fp32 always: in bf16 mode the compute copy, widened exactly.
  f.tensors.push_back(
      RawStTensor("params", flat.narrow(0, 0, store.numel()).to(at::kFloat), StDtype::kF32));
  if (s.bf16()) f.tensors.push_back(RawStTensor("master", s.master, StDtype::kF32));
  for (const auto& [name, t] : s.optimizer->state()) {
    f.tensors.push_back(RawStTensor("optimizer." + name, t, StDtype::kF32));
  }
  // No generator state: dropout masks are a function of the seed and the data position.
  f.metadata = {{"rank", std::to_string(g.rank)},
                {"tp_rank", std::to_string(g.tp_rank)},
                {"dp_rank", std::to_string(g.dp_rank)},
                {"step", std::to_string(step)},
                {"optimizer_step", std::to_string(s.optimizer->steps())}};
  return f;
}

// The manifest of a checkpoint of `s` at its position (files left empty).
CheckpointManifest Manifest(const TrainingState& s, const TrainingCheckpointRequest& req) {
  const comm::ProcessGroups& g = *s.groups;
  const JobSpec& spec = *s.spec;
  return CheckpointManifest{req.job_id.empty() ? "standalone" : req.job_id,
                            s.position.step,
                            req.attempt,
                            s.position.latch_generation,
                            s.position.step + 1,
                            s.position.next_first_micro_batch,
                            g.world_size,
                            g.tp,
                            g.dp,
                            spec.zero_stage,
                            spec.bf16,
                            spec.optimizer.type == OptimizerType::kSgd ? "SGD" : "AdamW",
                            req.compute_threads,
                            spec.model,
                            {},
                            static_cast<int64_t>(std::time(nullptr))};
}

}  // namespace

absl::StatusOr<CheckpointCommit> SaveTrainingCheckpoint(const TrainingState& state,
                                                        const TrainingCheckpointRequest& req) {
  const comm::ProcessGroups& g = *state.groups;
  const int64_t step = state.position.step;
  if (g.recorder) g.recorder->SetPhase(RankPhase::kCheckpoint);
  const auto start = Clock::now();
  const std::string temp = JoinPath(req.root, CheckpointTempDirName(step, req.attempt));
  absl::StatusOr<CheckpointFileEntry> entry =
      WriteCheckpointRankFile(temp, g.rank, RankState(state, step));
  if (entry.ok()) MaybeCrash("checkpoint.after_rank_files", g.rank, step);
  // Confirmations: every rank's record (ok, size, SHA-256) reaches every rank.
  uint8_t mine[kRecord] = {};
  if (entry.ok()) {
    mine[0] = 1;
    const int64_t size = entry->bytes;
    std::memcpy(mine + kSizeAt, &size, sizeof(size));
    PutDigest(entry->sha256, mine + kDigestAt);
  }
  std::vector<uint8_t> all(kRecord * g.world_size);
  LK_RETURN_IF_ERROR(ExchangeBytes(state, mine, kRecord, all.data(), /*gather=*/true));
  if (!entry.ok()) return entry.status();
  CheckpointManifest manifest = Manifest(state, req);
  CheckpointCommit c;
  std::string failed;
  for (int r = 0; r < g.world_size; ++r) {
    const uint8_t* x = all.data() + r * kRecord;
    if (x[0] != 1) failed += (failed.empty() ? "" : ",") + std::to_string(r);
    int64_t size = 0;
    std::memcpy(&size, x + kSizeAt, sizeof(size));
    manifest.files.push_back({CheckpointRankFileName(r), size, GetDigest(x + kDigestAt)});
    c.bytes += size;
  }
  if (!failed.empty()) {
    return absl::InternalError("checkpoint of step " + std::to_string(step) + " in " + temp +
                               ": rank(s) " + failed + " could not write their file");
  }
  // Rank 0 commits; its outcome (ok, manifest SHA-256) reaches every rank, then a barrier.
  uint8_t outcome[kOutcome] = {};
  absl::Status commit_status;
  if (g.rank == 0) {
    MaybeCrash("checkpoint.before_commit", g.rank, step);
    absl::StatusOr<std::string> sha = CommitCheckpoint(req.root, temp, manifest);
    outcome[0] = sha.ok() ? 1 : 0;
    if (sha.ok()) PutDigest(*sha, outcome + 1);
    commit_status = sha.status();
  }
  LK_RETURN_IF_ERROR(ExchangeBytes(state, outcome, kOutcome, outcome, /*gather=*/false));
  LK_RETURN_IF_ERROR(g.world->Barrier());
  LK_RETURN_IF_ERROR(commit_status);
  if (outcome[0] != 1) {
    return absl::InternalError("checkpoint of step " + std::to_string(step) +
                               ": rank 0 could not commit " + temp);
  }
  c.step = step;
  c.dir = JoinPath(req.root, CheckpointStepDirName(step));
  c.manifest_sha256 = GetDigest(outcome + 1);
  c.blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return c;
}

absl::Status LoadTrainingCheckpoint(TrainingState& state, const std::string& step_dir,
                                    const std::string& expected_job_id,
                                    const std::string& manifest_sha256) {
  const comm::ProcessGroups& g = *state.groups;
  ParamStore& store = *state.params;
  const FlatOps& ops = *state.ops;
  if (g.recorder) g.recorder->SetPhase(RankPhase::kCheckpoint);
  LK_ASSIGN_OR_RETURN(const CheckpointManifest m, VerifyCheckpoint(step_dir, manifest_sha256));
  LK_RETURN_IF_ERROR(CheckManifestFits(step_dir, m, Manifest(state, {}), expected_job_id));
  LK_ASSIGN_OR_RETURN(const StFile file, ReadCheckpointRankFile(step_dir, g.rank));
  const std::string src = JoinPath(step_dir, CheckpointRankFileName(g.rank));
  const auto meta = [&](const std::string& key) -> int64_t {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? -1 : std::atoll(it->second.c_str());
  };
  if (meta("rank") != g.rank || meta("tp_rank") != g.tp_rank || meta("dp_rank") != g.dp_rank ||
      meta("step") != m.step || meta("optimizer_step") < 0) {
    return absl::DataLossError(src + ": metadata (rank, tp_rank, dp_rank, step, optimizer_step) " +
                               "does not fit rank " + std::to_string(g.rank) + " of step " +
                               std::to_string(m.step));
  }
  // Read and check everything before anything is replaced.
  absl::Status bad;
  const auto read = [&](const std::string& name, StDtype dtype, at::ScalarType type,
                        int64_t count) {
    absl::StatusOr<at::Tensor> t = RawTensor(file, src, name, dtype, type, count);
    if (!t.ok() && bad.ok()) bad = t.status();
    return t.ok() ? *t : at::Tensor();
  };
  const int64_t n = store.numel();
  const int64_t chunk = state.part_numel();
  const bool bf16 = state.bf16();
  const at::Tensor params = read("params", StDtype::kF32, at::kFloat, n);
  const at::Tensor master = bf16 ? read("master", StDtype::kF32, at::kFloat, chunk) : params;
  std::map<std::string, at::Tensor> opt;
  for (const auto& [name, t] : state.optimizer->state()) {
    opt[name] = read("optimizer." + name, StDtype::kF32, at::kFloat, chunk);
  }
  // rng.* tensors of older files are ignored: dropout follows the seed and the data position.
  LK_RETURN_IF_ERROR(bad);
  if (absl::Status st = state.optimizer->LoadState(meta("optimizer_step"), opt); !st.ok()) {
    return absl::DataLossError(src + ": " + std::string(st.message()));
  }
  state.position = {m.step, m.latch_generation, m.next_first_micro_batch};
  const c10::Device device = store.device();
  if (!bf16) {
    ops.Copy(store.flat_params().narrow(0, 0, n), params.to(device));
    return absl::OkStatus();
  }
  // The compute copy: the saved one, with this rank's partition recomputed from the master
  // exactly as the engine's optimizer step does; the two must agree.
  ops.Copy(state.master, master.to(device));
  const at::Tensor& compute = store.flat_compute();
  ops.Copy(compute.narrow(0, 0, n), params.to(device));
  ops.Copy(compute.narrow(0, state.part_begin, chunk), state.master);
  if (!at::equal(compute.narrow(0, 0, n).cpu().to(at::kFloat), params)) {
    return absl::DataLossError(src + ": params disagree with the bf16 rounding of master");
  }
  return absl::OkStatus();
}

}  // namespace latchkey
