// The training engine: runs one accumulation window exactly as its latch says.
//
// Per window (docs/model.md): for each micro-batch, forward + backward of loss / n_s on this rank's
// samples; per_micro_batch latches sum the K/V rows over TP after every backward; micro-batches
// not marked no_sync take the DP mean of the accumulated gradient. At the boundary: K/V sum over
// TP (deferred/coalesced) -> DP reduction (ZeRO-0 mean all-reduce; ZeRO-1 reduce-scatter into the
// rank's partition) -> global grad norm -> clip -> optimizer step -> (ZeRO-1) all-gather of
// parameters. ZeRO-2 (DP > 1) instead reduce-scatters every synchronised micro-batch's gradient
// during its backward, bucket by bucket, into the rank's gradient partition (grad_buckets.h), and
// runs the deferred/coalesced K/V sum on that partition at the boundary (docs/memory.md). Each
// ZeRO stage's gradient synchronisation is one strategy (grad_sync.h) the engine calls around
// every backward and at the boundary. A latch is never mixed with another mode inside its
// window. The update of step s
// uses the learning rate of the spec's schedule (lr_schedule.h). With `latchkey.eval`, the
// evaluation loss (evaluator.h) is computed after the update of the steps it is due on, outside
// the step's `step_seconds` and its collective counts.
//
// The engine trains; saving and restoring what it trains is the checkpoint module's
// (worker/checkpoint/checkpointer.h), through the engine's one view of its state (state()).
//
// Every number in the flat parameter, gradient and optimizer buffers is computed through FlatOps
// (flat_ops.h) on the buffers' device, and every collective gets device-tagged buffers.
// Torch stays inside the .cc files; this header is torch-free so the runner and the
// coordinator-side code never compile libtorch headers.
// Thread-safety: one thread.
// Errors: a bad latch and a collective failing outside autograd come back as a Status. A
// collective failing inside autograd (the TP layers) throws comm::CollectiveError carrying its
// Status; a libtorch error (a bug, e.g. a shape mismatch) throws c10::Error. Neither is caught
// here: they reach the worker's top loop, which maps them to a Status once. After any error the
// engine's state is undefined: run no further windows.
#ifndef LATCHKEY_WORKER_TRAIN_ENGINE_H_
#define LATCHKEY_WORKER_TRAIN_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "common/step_report.h"
#include "worker/comm/process_groups.h"

namespace latchkey {

class ParamStore;
struct TrainingState;  // worker/checkpoint/training_state.h

struct EngineOptions {
  bool skip_kv_reduction_for_testing = false;
  // ZeRO-1 over DP > 1: the boundary reduce-scatter is bucketed and issued during the last
  // micro-batch's backward (grad_buckets.h; the K/V rows' bucket last, after the boundary K/V
  // sum), with results bitwise equal to the whole-buffer reduce-scatter on shm. Off by default:
  // one reduce_scatter/dp per bucket instead of one per window, and on the CPU the blocking
  // collectives have no spare core to overlap with (docs/memory.md).
  bool overlap_dp_reduction = false;  // or the spec's latchkey.overlap_dp_reduction
  // When set, after the boundary reduction of window `dump_grads_step` (before clipping) each
  // rank writes its local shard's gradient, the window mean over DP, as a safetensors file
  // `dump_grads_dir/grads-rank{R}.safetensors` (one tensor per parameter, TP-local shapes).
  // Under ZeRO-1 a rank has reduced only its own partition (the in-place reduce-scatter uses the
  // rest of the buffer as scratch), so the dump first all-gathers the partitions over DP into a
  // separate buffer: one extra all_gather/dp in that window, and the same file as ZeRO-0 writes.
  std::string dump_grads_dir;
  int64_t dump_grads_step = -1;
  // --dump-samples FILE N: the rank's first N micro-batches (positions, sample indices, token
  // ids) to "FILE.rank<R>" (worker/data/sample_dump.h). Empty: no dump.
  std::string dump_samples_file;
  int64_t dump_samples_micro_batches = 0;
  // Where the flat buffers live and their arithmetic runs. CreateEngine fails UNIMPLEMENTED for
  // a device this build has no kernels for (the CPU only, today).
  comm::Device device = comm::Device::Cpu();
  // The checkpoint module's weight readers and writers (worker/checkpoint/checkpointer.h:
  // LoadInitFrom, WriteGradDump), called by the engine at fixed points; the engine includes
  // none of their code. Fills a fresh parameter store with TP rank `tp_rank`'s shard of
  // spec.init_from: needed when the spec has one (CreateEngine fails FAILED_PRECONDITION naming
  // latchkey.init_from without it).
  std::function<absl::Status(const JobSpec& spec, int tp_rank, ParamStore& store)> load_init_from;
  // Writes the gradient dump of dump_grads_step into `dir`: needed with dump_grads_dir.
  std::function<absl::Status(const TrainingState& state, const std::string& dir)> write_grads;
};

// When the DP reduction buckets of the last window's last micro-batch were issued (in issue
// order, the K/V bucket last) and when that micro-batch's backward returned: the evidence that
// they overlap the backward. Empty `issued` when its DP reduction was not bucketed.
struct BucketTrace {
  std::vector<std::chrono::steady_clock::time_point> issued;
  std::chrono::steady_clock::time_point backward_end;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Runs window latch.window (and, where due, the evaluation after it: StepReport::eval_loss).
  // A window whose loss or global grad norm is not finite (StepDiverged(report), the same
  // verdict on every rank) is not applied: no optimizer step, no evaluation, state() stays
  // after the previous window; its report carries the non-finite values. Run no further
  // windows after it (the job ends there: common/error_info.h TRAINING_DIVERGED).
  // REQUIRES: windows run in order, each latch valid for this job.
  virtual absl::StatusOr<StepReport> RunWindow(const Latch& latch) = 0;
  // Optimizer state bytes held by this rank (ZeRO-1 partitions it over DP).
  virtual int64_t optimizer_state_bytes() const = 0;
  // The view of this rank's training state (worker/checkpoint/training_state.h) the checkpoint
  // module saves and restores through (worker/checkpoint/checkpointer.h). Valid while the
  // engine lives; its position is the last window run. Between windows only.
  virtual TrainingState& state() = 0;
  // The high-water mark, over the last window, of the gradient bytes this rank held: the flat
  // gradient buffer while it exists, ZeRO-2's gradient partition, its bucket and K/V staging,
  // the K/V reducers' snapshot and staging while they exist, and the bf16 gradients of the
  // compute parameters.
  virtual int64_t peak_gradient_bytes() const = 0;
  virtual BucketTrace last_bucket_trace() const = 0;
};

// Builds the model shard (from spec.init_from through options.load_init_from, or from the seed),
// the data source and optimizer.
// Errors name the spec field (e.g. "latchkey.init_from: ..."). `groups` must outlive the engine.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const JobSpec& spec,
                                                     comm::ProcessGroups* groups,
                                                     const EngineOptions& options = {});

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_ENGINE_H_
