// Checkpoint I/O of one rank's training state (training_state.h), the engine's view of it:
// resumable training checkpoints (save with the write / confirm / commit protocol, and load
// after verification; docs/fault-tolerance.md), the HF export of the weights, the HF import of
// latchkey.init_from and the gradient dump. The engine trains; this module saves and restores
// what it trains (torchtitan's components/checkpoint.py next to its train.py): the file format
// lives here and in train_checkpoint.h / hf_checkpoint.h, never in the engine's training code.
//
// This header is torch-free (the runner includes it); the state view is only named.
// Thread-safety: one thread per rank, the engine's. Functions documented as collective must be
// called by every rank in the same order (they issue collectives over the state's groups).
// Errors: as documented per function; a collective failing comes back as its Status.
#ifndef LATCHKEY_WORKER_CHECKPOINT_CHECKPOINTER_H_
#define LATCHKEY_WORKER_CHECKPOINT_CHECKPOINTER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {

class ParamStore;
struct TrainingState;

// Where and as what a resumable checkpoint is saved (docs/fault-tolerance.md). The step, the
// latch generation and the data position come from the state (TrainingState::position).
struct TrainingCheckpointRequest {
  std::string root;    // latchkey.checkpoint.dir
  std::string job_id;  // empty: "standalone"
  int64_t attempt = 1;
  int compute_threads = 1;
};

// Collective (every rank): writes this rank's state after window state.position.step into the
// attempt's temporary folder, confirms it with all ranks over the world group (an all-gather of
// every rank's size and SHA-256), rank 0 commits, and rank 0's outcome is broadcast. Returns the
// commit, the same on every rank; a rank that failed to write fails every rank.
absl::StatusOr<CheckpointCommit> SaveTrainingCheckpoint(const TrainingState& state,
                                                        const TrainingCheckpointRequest& r);

// Not collective. Replaces the parameters, the fp32 master (bf16), the optimizer state (AdamW
// exp_avg, exp_avg_sq and step count), the dropout generator states and the data position with
// those of the checkpoint in `step_dir`, after verifying every file of it (DATA_LOSS naming the
// file) and, when `manifest_sha256` is non-empty, the manifest's SHA-256. Refuses
// (FAILED_PRECONDITION naming the field) a checkpoint of another job (unless `expected_job_id` is
// empty), world_size, tp, zero_stage, bf16, optimizer or model. A checkpoint refused for its
// layout, or one whose files do not verify, changes nothing.
absl::Status LoadTrainingCheckpoint(TrainingState& state, const std::string& step_dir,
                                    const std::string& expected_job_id,
                                    const std::string& manifest_sha256);

// Collective (every rank): gathers the shards (the fp32 master in bf16 mode) and, on global rank
// 0 only, writes an HF checkpoint into `dir` (hf_checkpoint.h).
absl::Status SaveHfCheckpoint(const TrainingState& state, const std::string& dir);

// Fills a fresh parameter store with TP rank `tp_rank`'s shard of the HF checkpoint in
// spec.init_from (EngineOptions::load_init_from). Errors name latchkey.init_from: NOT_FOUND /
// UNIMPLEMENTED from ReadHfCheckpoint, INVALID_ARGUMENT for a config that disagrees with
// spec.model, a non-float tensor or one the store cannot take.
absl::Status LoadInitFrom(const JobSpec& spec, int tp_rank, ParamStore& store);

// Writes this rank's gradient (its TP-local shard, the DP mean after the boundary reduction) as
// `dir/grads-rank{R}.safetensors`, one tensor per parameter (EngineOptions::write_grads).
// Collective over DP under ZeRO-1: the partitions are all-gathered into a copy first.
absl::Status WriteGradDump(const TrainingState& state, const std::string& dir);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_CHECKPOINTER_H_
