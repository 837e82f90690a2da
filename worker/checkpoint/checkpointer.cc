// Saving resumable training checkpoints of a TrainingState (latchkey-checkpoint/2): the host
// staging of this rank's share, the write of its pieces, and the commit (every rank's outcome and
// region digests over the world group, the replica comparison, rank 0's manifest). Loading is
// in checkpoint_load.cc.
#include "worker/checkpoint/checkpointer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/crash_point.h"
#include "common/error_info.h"
#include "common/status_macros.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/logical_layout.h"
#include "worker/checkpoint/pieces.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/process_groups.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/param_store.h"
#include "worker/train/flat_ops.h"
#include "worker/train/optimizer.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

// A SHA-256 as it travels between ranks: its 64 hex characters, as bytes.
constexpr int kDigestBytes = 64;
// The confirmation record of one rank: ok (1 byte), the file's size (int64, host order: every
// rank of a job runs one build), the file's SHA-256, then the SHA-256 of every region the rank
// holds (LayoutTable::held_by order), padded to the most any rank holds.
constexpr int kSizeAt = 1;
constexpr int kDigestAt = kSizeAt + 8;
constexpr int kRegionsAt = kDigestAt + kDigestBytes;
// The record's first byte.
constexpr uint8_t kWriteFailed = 0;
constexpr uint8_t kWritten = 1;
constexpr uint8_t kNoRoom = 2;  // failed for lack of room (IsOutOfSpace)
// A failed rank's error text closes its record (truncated): every rank can name the file.
constexpr int kMessageBytes = 256;
// Rank 0's commit outcome: 0 failed, 1 committed as step-N, 2 as step-N.<job uid>, 3 failed
// for lack of room (1 byte); the manifest's SHA-256; rank 0's error text.
constexpr uint8_t kCommitNoRoom = 3;
constexpr int kOutcomeMessageAt = 1 + kDigestBytes;
constexpr int kOutcome = kOutcomeMessageAt + kMessageBytes;

void PutDigest(const std::string& hex, uint8_t* out) {
  std::memcpy(out, hex.data(), std::min<size_t>(hex.size(), kDigestBytes));
}
std::string GetDigest(const uint8_t* in) {
  return std::string(reinterpret_cast<const char*>(in), kDigestBytes);
}
void PutMessage(absl::string_view text, uint8_t* out) {
  std::memcpy(out, text.data(), std::min<size_t>(text.size(), kMessageBytes));
}
std::string GetMessage(const uint8_t* in) {
  const char* p = reinterpret_cast<const char*>(in);
  return std::string(p, strnlen(p, kMessageBytes));
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

bool IsDirectory(const std::string& path) {
  absl::StatusOr<PathKind> kind = GetPathKind(path);
  return kind.ok() && *kind == PathKind::kDirectory;
}

// The layout a state is laid out in.
LayoutSpec LayoutOfState(const TrainingState& s) {
  return LayoutSpec{s.spec->model, s.groups->tp,
                    s.groups->dp,  s.spec->zero_stage,
                    s.bf16(),      s.spec->optimizer.type == OptimizerType::kAdamW};
}

bool SameLayout(const LayoutSpec& a, const LayoutSpec& b) {
  return a.model == b.model && a.tp == b.tp && a.dp == b.dp && a.zero_stage == b.zero_stage &&
         a.bf16 == b.bf16 && a.adamw == b.adamw;
}

// The flat tensor of the state that holds `kind` over HeldRange (from its begin).
at::Tensor HeldTensor(const TrainingState& s, TensorKind kind, int64_t begin, int64_t n) {
  switch (kind) {
    case TensorKind::kParam:
      return s.bf16() ? s.master.narrow(0, 0, n) : s.params->flat_params().narrow(0, begin, n);
    case TensorKind::kExpAvg:
      return s.optimizer->state().at("exp_avg").narrow(0, 0, n);
    case TensorKind::kExpAvgSq:
      return s.optimizer->state().at("exp_avg_sq").narrow(0, 0, n);
  }
  return {};
}

}  // namespace

struct StagedCheckpoint::Impl {
  int64_t step = -1;
  int rank = 0;
  int world = 1;
  std::string root;
  std::string temp;
  std::unique_ptr<LayoutTable> table;
  std::vector<std::vector<float>> values;  // per table->kinds(), HeldRange of this rank
  CheckpointManifest manifest;             // files and tensors filled at commit
  // WriteStagedCheckpoint's results.
  CheckpointFileEntry entry;
  std::vector<std::string> digests;
};

namespace {

// Every rank agreed that the save of `step` failed for lack of room on rank(s) `ranks` (`what`:
// the first one's error): nothing is committed. Each rank removes its own file, a barrier, then
// the temporary folder, now empty, goes (whichever rank comes first). CHECKPOINT_OUT_OF_SPACE
// (common/error_info.h) naming the step, the ranks and the error; a removal that fails is added
// to the message (the next commit's pruning removes what is left).
absl::Status NotSavedForLackOfRoom(const comm::ProcessGroups& g, const std::string& temp,
                                   int64_t step, const std::string& ranks, int first,
                                   const std::string& what) {
  std::string left;
  const auto note = [&left](const absl::Status& st) {
    if (!st.ok()) left += "; then " + std::string(st.message());
  };
  note(RemoveFileIfPresent(JoinPath(temp, CheckpointRankFileName(g.rank))));
  LK_RETURN_IF_ERROR(g.world->Barrier());
  note(RemoveEmptyDirIfPresent(temp));
  ErrorInfo info;
  info.reason = error_reason::kCheckpointOutOfSpace;
  info.metadata = {{"step", std::to_string(step)}, {"rank", std::to_string(first)}};
  return WithErrorInfo(
      absl::ResourceExhaustedError("checkpoint of step " + std::to_string(step) +
                                   " not saved: no room on rank(s) " + ranks + ": rank " +
                                   std::to_string(first) + ": " + what + left),
      info);
}

}  // namespace

StagedCheckpoint::StagedCheckpoint() : impl_(std::make_unique<Impl>()) {}
StagedCheckpoint::~StagedCheckpoint() = default;
int64_t StagedCheckpoint::step() const { return impl_->step; }
int64_t StagedCheckpoint::bytes() const {
  int64_t n = 0;
  for (const std::vector<float>& v : impl_->values) n += v.capacity() * sizeof(float);
  return n;
}

absl::Status StageTrainingCheckpoint(const TrainingState& state,
                                     const TrainingCheckpointRequest& req,
                                     StagedCheckpoint& staged) {
  StagedCheckpoint::Impl& x = *staged.impl_;
  const comm::ProcessGroups& g = *state.groups;
  const LayoutSpec layout = LayoutOfState(state);
  if (x.table == nullptr || !SameLayout(x.table->spec(), layout)) {
    absl::StatusOr<LayoutTable> table = LayoutTable::Build(layout);
    if (!table.ok()) return table.status();
    x.table = std::make_unique<LayoutTable>(*std::move(table));
  }
  const LayoutTable& t = *x.table;
  const std::vector<TensorKind> kinds = t.kinds();
  x.values.resize(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto [begin, end] = t.HeldRange(g.rank, kinds[k]);
    const bool partitioned = kinds[k] != TensorKind::kParam || state.bf16();
    if (partitioned && begin != std::min(state.part_begin, t.numel())) {
      return absl::InternalError("checkpoint: the engine's partition starts at " +
                                 std::to_string(state.part_begin) + ", the layout's at " +
                                 std::to_string(begin));
    }
    std::vector<float>& v = x.values[k];
    v.resize(end - begin);  // keeps the capacity of an earlier save
    if (v.empty()) continue;
    at::from_blob(v.data(), {end - begin}, at::kFloat)
        .copy_(HeldTensor(state, kinds[k], begin, end - begin));
  }
  if (req.perturb_replica_rank_for_testing == g.rank) {
    for (int i : t.held_by(g.rank)) {
      const Region& r = t.regions()[i];
      if (r.holders.size() < 2) continue;
      const size_t k = std::find(kinds.begin(), kinds.end(), r.kind) - kinds.begin();
      float& f = x.values[k][r.flat_begin - t.HeldRange(g.rank, r.kind).first];
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      bits ^= 1u;
      std::memcpy(&f, &bits, sizeof(bits));
      break;
    }
  }
  const JobSpec& spec = *state.spec;
  CheckpointManifest& m = x.manifest;
  m = CheckpointManifest();
  m.job_id = req.job_id.empty() ? "standalone" : req.job_id;
  m.job_uid = req.job_uid;
  m.step = state.position.step;
  m.attempt = req.attempt;
  m.latch_generation = state.position.latch_generation;
  m.next_window = state.position.step + 1;
  m.next_first_micro_batch = state.position.next_first_micro_batch;
  m.next_first_sample = state.position.next_first_sample;
  m.seed = spec.seed;
  m.world_size = g.world_size;
  m.tp = g.tp;
  m.dp = g.dp;
  m.zero_stage = spec.zero_stage;
  m.bf16 = spec.bf16;
  m.optimizer = spec.optimizer.type == OptimizerType::kSgd ? "SGD" : "AdamW";
  m.optimizer_step = state.optimizer->steps();
  m.compute_threads = req.compute_threads;
  m.model = spec.model;
  m.created_unix_seconds = static_cast<int64_t>(std::time(nullptr));
  x.step = m.step;
  x.rank = g.rank;
  x.world = g.world_size;
  x.root = req.root;
  x.temp = JoinPath(req.root, CheckpointTempDirName(m.step, req.job_uid, req.attempt));
  x.entry = {};
  x.digests.clear();
  return absl::OkStatus();
}

absl::Status WriteStagedCheckpoint(StagedCheckpoint& staged) {
  StagedCheckpoint::Impl& x = *staged.impl_;
  if (x.step < 0 || x.table == nullptr) {
    return absl::FailedPreconditionError("checkpoint: nothing staged to write");
  }
  std::vector<const float*> values;
  for (const std::vector<float>& v : x.values) values.push_back(v.data());
  x.digests = ShareDigests(*x.table, x.rank, values);
  absl::StatusOr<CheckpointFileEntry> entry = WriteShare(*x.table, x.temp, x.rank, x.step, values);
  if (!entry.ok()) return entry.status();
  x.entry = *entry;
  MaybeCrash("checkpoint.after_rank_files", x.rank, x.step);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointCommit> CommitStagedCheckpoint(const TrainingState& state,
                                                        StagedCheckpoint& staged,
                                                        const absl::Status& write_status) {
  StagedCheckpoint::Impl& x = *staged.impl_;
  const comm::ProcessGroups& g = *state.groups;
  if (x.table == nullptr) return absl::FailedPreconditionError("checkpoint: nothing staged");
  const LayoutTable& t = *x.table;
  const int64_t step = x.step;
  if (g.recorder) g.recorder->SetPhase(RankPhase::kCheckpoint);
  // Confirmations: every rank's record (ok, size, SHA-256, region digests) reaches every rank.
  size_t most = 0;
  for (int r = 0; r < g.world_size; ++r) most = std::max(most, t.held_by(r).size());
  const int64_t message_at = kRegionsAt + static_cast<int64_t>(most) * kDigestBytes;
  const int64_t record = message_at + kMessageBytes;
  std::vector<uint8_t> mine(record, 0);
  if (!write_status.ok()) {
    mine[0] = IsOutOfSpace(write_status) ? kNoRoom : kWriteFailed;
    PutMessage(write_status.message(), mine.data() + message_at);
  } else {
    mine[0] = kWritten;
    const int64_t size = x.entry.bytes;
    std::memcpy(mine.data() + kSizeAt, &size, sizeof(size));
    PutDigest(x.entry.sha256, mine.data() + kDigestAt);
    for (size_t i = 0; i < x.digests.size(); ++i) {
      PutDigest(x.digests[i], mine.data() + kRegionsAt + i * kDigestBytes);
    }
  }
  std::vector<uint8_t> all(record * g.world_size);
  LK_RETURN_IF_ERROR(ExchangeBytes(state, mine.data(), record, all.data(), /*gather=*/true));
  // The verdict, the same on every rank (every rank sees every record): when every rank that
  // failed found no room, the save is dropped and training goes on; any other failure fails
  // every rank (the attempt ends, as for any fault).
  const std::string& temp = x.temp;
  std::string failed;
  int no_room = -1;
  bool other = false;
  for (int r = 0; r < g.world_size; ++r) {
    const uint8_t code = all[r * record];
    if (code == kWritten) continue;
    failed += (failed.empty() ? "" : ",") + std::to_string(r);
    if (code == kNoRoom && no_room < 0) no_room = r;
    other = other || code != kNoRoom;
  }
  if (!failed.empty() && !other) {
    return NotSavedForLackOfRoom(g, temp, step, failed, no_room,
                                 GetMessage(all.data() + no_room * record + message_at));
  }
  if (!write_status.ok()) return write_status;
  if (!failed.empty()) {
    return absl::InternalError("checkpoint of step " + std::to_string(step) + " in " + temp +
                               ": rank(s) " + failed + " could not write their file");
  }
  CheckpointManifest manifest = x.manifest;
  CheckpointCommit c;
  std::vector<std::vector<std::string>> digests(g.world_size);
  for (int r = 0; r < g.world_size; ++r) {
    const uint8_t* rec = all.data() + r * record;
    int64_t size = 0;
    std::memcpy(&size, rec + kSizeAt, sizeof(size));
    manifest.files.push_back({CheckpointRankFileName(r), size, GetDigest(rec + kDigestAt)});
    for (size_t i = 0; i < t.held_by(r).size(); ++i) {
      digests[r].push_back(GetDigest(rec + kRegionsAt + i * kDigestBytes));
    }
    c.bytes += size;
  }
  // Every rank sees the same digests, so every rank refuses a disagreement alike.
  absl::StatusOr<std::vector<CheckpointTensor>> tensors = TensorsFromDigests(t, digests, step);
  if (!tensors.ok()) return tensors.status();
  manifest.tensors = *std::move(tensors);
  // Rank 0 commits; its outcome (ok, manifest SHA-256) reaches every rank, then a barrier.
  uint8_t outcome[kOutcome] = {};
  absl::Status commit_status;
  if (g.rank == 0) {
    MaybeCrash("checkpoint.before_commit", g.rank, step);
    absl::StatusOr<CommittedCheckpoint> done = CommitCheckpoint(x.root, temp, manifest);
    if (done.ok()) {
      // Every rank names the folder: step-N, or step-N.<uid> when step-N is another job's.
      outcome[0] = done->dir == JoinPath(x.root, CheckpointStepDirName(step)) ? 1 : 2;
      PutDigest(done->manifest_sha256, outcome + 1);
    } else if (IsOutOfSpace(done.status()) && IsDirectory(temp)) {
      // No room for the manifest, and the folder was not renamed: nothing is committed.
      outcome[0] = kCommitNoRoom;
      PutMessage(done.status().message(), outcome + kOutcomeMessageAt);
    }
    commit_status = done.status();
  }
  LK_RETURN_IF_ERROR(ExchangeBytes(state, outcome, kOutcome, outcome, /*gather=*/false));
  if (outcome[0] == kCommitNoRoom) {
    return NotSavedForLackOfRoom(g, temp, step, "0", 0, GetMessage(outcome + kOutcomeMessageAt));
  }
  LK_RETURN_IF_ERROR(g.world->Barrier());
  LK_RETURN_IF_ERROR(commit_status);
  if (outcome[0] != 1 && outcome[0] != 2) {
    return absl::InternalError("checkpoint of step " + std::to_string(step) +
                               ": rank 0 could not commit " + temp);
  }
  c.step = step;
  c.dir = JoinPath(x.root, CheckpointStepDirName(step, outcome[0] == 2 ? manifest.job_uid : ""));
  c.manifest_sha256 = GetDigest(outcome + 1);
  return c;
}

absl::StatusOr<CheckpointCommit> SaveTrainingCheckpoint(const TrainingState& state,
                                                        const TrainingCheckpointRequest& req) {
  const comm::ProcessGroups& g = *state.groups;
  if (g.recorder) g.recorder->SetPhase(RankPhase::kCheckpoint);
  const auto start = Clock::now();
  StagedCheckpoint staged;
  // A rank that cannot stage still takes part in the commit's exchange, which fails every rank.
  const absl::Status stage = StageTrainingCheckpoint(state, req, staged);
  const absl::Status written = stage.ok() ? WriteStagedCheckpoint(staged) : stage;
  LK_ASSIGN_OR_RETURN(CheckpointCommit c, CommitStagedCheckpoint(state, staged, written));
  c.blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return c;
}

}  // namespace latchkey
