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

#include <cstdint>
#include <memory>
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
  // The job's uid (common/job_uid.h): the manifest names it, and the temporary and committed
  // folders are this job's by it. Empty: a writer without one (its saves are never pruned).
  std::string job_uid;
  int64_t attempt = 1;
  int compute_threads = 1;
  // Tests only (latchkey-worker --test-perturb-replica-rank): this rank flips one bit of the
  // first replicated region it holds, so the commit must refuse the save. -1: none.
  int perturb_replica_rank_for_testing = -1;
};

// A host copy of this rank's share of one checkpoint: everything the rank will write or hash,
// taken on the training thread so training may go on while it is written. Reusable: staging
// into the same object again reuses its host buffers when the sizes fit (no reallocation).
class StagedCheckpoint {
 public:
  StagedCheckpoint();
  ~StagedCheckpoint();
  StagedCheckpoint(const StagedCheckpoint&) = delete;
  StagedCheckpoint& operator=(const StagedCheckpoint&) = delete;
  int64_t step() const;   // the step staged (-1 before the first Stage)
  int64_t bytes() const;  // host bytes held by the staging buffers

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend absl::Status StageTrainingCheckpoint(const TrainingState&,
                                              const TrainingCheckpointRequest&, StagedCheckpoint&);
  friend absl::Status WriteStagedCheckpoint(StagedCheckpoint&);
  friend absl::StatusOr<CheckpointCommit> CommitStagedCheckpoint(const TrainingState&,
                                                                 StagedCheckpoint&,
                                                                 const absl::Status&);
};

// Training thread, NOT collective: copies this rank's state at state.position into `staged`
// (device -> host where needed): the values of every logical tensor this rank holds
// (logical_layout.h), and the manifest's fields. Blocks training only for the copy.
// Test hook: req.perturb_replica_rank_for_testing == this rank flips one bit of the first
// replicated region it holds, so the commit must refuse the save.
absl::Status StageTrainingCheckpoint(const TrainingState& state,
                                     const TrainingCheckpointRequest& req,
                                     StagedCheckpoint& staged);

// Any thread, NOT collective, touches no TrainingState and issues no collective: writes this
// rank's file of the staged checkpoint (the pieces it is the writer of) into the attempt's
// temporary folder, fsyncs it and computes its size and SHA-256 and the SHA-256 of every region
// the rank holds (the replicas the commit compares).
absl::Status WriteStagedCheckpoint(StagedCheckpoint& staged);

// Training thread, COLLECTIVE over the world group (every rank calls it in the same window
// boundary): exchanges every rank's outcome (`write_status` is this rank's
// WriteStagedCheckpoint result) and region digests, compares the replicas (DATA_LOSS naming the
// tensor and the ranks when they disagree, on every rank), rank 0 commits the manifest, rank 0's
// outcome is broadcast, barrier. Returns the commit (same on every rank) or the failure (a rank
// that failed to write fails every rank). When every rank that failed (to write its file, or
// rank 0 its manifest) found no room (files.h, IsOutOfSpace), every rank returns RESOURCE_
// EXHAUSTED with reason CHECKPOINT_OUT_OF_SPACE (common/error_info.h) naming the step, the ranks
// and the first one's error (its file and strerror's text), after removing its own file, a
// barrier and the removal of the emptied temporary folder: nothing of the save is left.
// CheckpointCommit::blocked_seconds is left 0: the caller measures times.
absl::StatusOr<CheckpointCommit> CommitStagedCheckpoint(const TrainingState& state,
                                                        StagedCheckpoint& staged,
                                                        const absl::Status& write_status);

// Collective: Stage, Write, Commit in order on the calling thread (the synchronous save);
// blocked_seconds = the whole time.
absl::StatusOr<CheckpointCommit> SaveTrainingCheckpoint(const TrainingState& state,
                                                        const TrainingCheckpointRequest& r);

// Not collective. Replaces the parameters (bf16: the fp32 master of this rank's partition and
// the compute copy, its bf16 rounding), the optimizer state (AdamW exp_avg, exp_avg_sq and step
// count) and the data position with those of the checkpoint in `step_dir`, whatever layout
// wrote it (latchkey-checkpoint/2 or /1): this rank reads only the byte ranges of the pieces
// that meet what it holds, checks each piece's SHA-256 (version 1: every file's) and every
// file's size (DATA_LOSS naming the file), and, when `manifest_sha256` is non-empty, the
// manifest's SHA-256. Dropout generator states are not restored (version 1's rng.* tensors are
// ignored). Refuses (FAILED_PRECONDITION naming the field) a checkpoint of another job (its
// job_id, unless `expected_job_id` is empty; its job_uid, unless `expected_job_uid` or the
// manifest's is empty), optimizer or model. A refused checkpoint, or one whose pieces do not
// verify, changes nothing.
absl::Status LoadTrainingCheckpoint(TrainingState& state, const std::string& step_dir,
                                    const std::string& expected_job_id,
                                    const std::string& manifest_sha256,
                                    const std::string& expected_job_uid = "");

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
