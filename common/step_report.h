// What one rank reports about one optimizer step (window): the engine produces it, the per-step
// JSONL and the worker's metrics print it, and WorkerService.ReportStep carries it.
#ifndef LATCHKEY_COMMON_STEP_REPORT_H_
#define LATCHKEY_COMMON_STEP_REPORT_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/job_spec.h"

namespace latchkey {

// The tag of every collective the evaluation issues (comm::CollectiveOptions::tag): counted in
// CollectiveStats and the worker's metrics, never in a step's collective_calls.
inline constexpr const char* kEvalTag = "eval";

struct StepReport {
  int64_t step = 0;
  int micro_batches = 0;  // the window's n (per replica, the even split's count)
  // The micro-batches this rank's DP replica computed: n, or its share of an uneven split
  // (latchkey.stragglers.rebalance; Latch::replica_micro_batches).
  int replica_micro_batches = 0;
  // The rank's own compute in its micro-batches: their wall time less the time inside
  // collectives during them (a rank waiting for its TP peers is not slow; the straggler score).
  double compute_seconds = 0.0;
  // The wall time of those micro-batches less only the time in data-parallel and world
  // collectives during them (ZeRO's reductions in the last backward wait on the other
  // replicas): its replica's pace, TP collectives included (the rebalancing measure).
  double micro_batch_seconds = 0.0;
  double loss = 0.0;       // mean over every token of the window across all DP ranks
  double grad_norm = 0.0;  // global, before clipping
  KvMode kv_mode = KvMode::kPerMicroBatch;
  int64_t kv_allreduce_calls = 0;  // this rank, this step (observed)
  // Every TP reduction of replicated-parameter gradients this rank issued in this step: the K/V
  // collectives and, under sequence parallelism, those of the LayerNorm and row-parallel bias
  // gradients (one coalesced collective carries both and counts once). Observed.
  int64_t replicated_allreduce_calls = 0;
  std::map<std::string, int64_t> collective_calls;  // "op/group" -> count (observed)
  double step_seconds = 0.0;
  // Time this rank spent inside collectives during the step (observed; every op and group).
  double collective_seconds = 0.0;
  int64_t tokens = 0;                 // whole job, this step: n_s * MB * DP * S
  int64_t optimizer_state_bytes = 0;  // this rank's optimizer state (ZeRO-1: its partition)
  int64_t latch_generation = 0;       // generation of the latch the step ran under
  double latch_wait_seconds = 0.0;    // time the window waited for its latch (0 standalone)
  double lr = 0.0;                    // learning rate of this step's update (schedule, float64)
  // Evaluation loss after this step's update, on the steps where evaluation ran.
  std::optional<double> eval_loss;
  // Time this rank waited in the window's first boundary collective (the straggler measure:
  // the spread over ranks of a window is how late the slowest rank arrived).
  double boundary_wait_seconds = 0.0;
  // Training time blocked by the checkpoint taken after this step (latchkey.checkpoint), on the
  // steps that saved one; not part of step_seconds. Asynchronous saves: the staging copy.
  std::optional<double> checkpoint_seconds;
  // An asynchronous save that committed at this step's boundary: the time from the end of its
  // staging to the end of its commit (written, fsynced and checksummed in the background, then
  // committed here); on those steps only (every_steps 1: the last step's is the sum of two).
  std::optional<double> checkpoint_background_seconds;
  // Memory of this rank (worker/memory/memory.h, docs/memory.md "Measuring memory"), in bytes.
  // The high-water mark of the bytes its tensors held during this step (CPU: the counting
  // allocator's account of the engine; CUDA: the caching allocator's allocated bytes).
  int64_t peak_memory_bytes = 0;
  // Bytes allocated at the end of the window's last micro-batch forward minus bytes allocated
  // just before that forward: what its backward will consume.
  int64_t activation_memory_bytes = 0;
  // CUDA: the caching allocator's reserved bytes at the end of the step; 0 on the CPU.
  int64_t reserved_memory_bytes = 0;
};

// Derived per-step figures of the JSONL and TensorBoard: tokens / step_seconds, and the share of
// the step's time spent in its collectives (0 when step_seconds is 0).
inline double TokensPerSecond(const StepReport& r) {
  return r.step_seconds > 0 ? static_cast<double>(r.tokens) / r.step_seconds : 0.0;
}
inline double CollectiveShare(const StepReport& r) {
  return r.step_seconds > 0 ? r.collective_seconds / r.step_seconds : 0.0;
}

// Whether the step diverged: its loss or its global gradient norm is not finite (NaN or ±Inf).
// Such a step's update was not applied (the engine checks before the optimizer step, on every
// rank alike) and the job ends with it (common/error_info.h TRAINING_DIVERGED).
inline bool StepDiverged(const StepReport& r) {
  return !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
}

// A committed resumable checkpoint, as rank 0 reports it (WorkerService.ReportCheckpoint).
struct CheckpointReport {
  int64_t step = -1;             // the checkpoint holds the state after this step
  std::string manifest_sha256;   // hex SHA-256 of its manifest.json
  int64_t bytes = 0;             // all its files
  double blocked_seconds = 0.0;  // training time it blocked on the reporting rank
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_STEP_REPORT_H_
