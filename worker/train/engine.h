// The training engine: runs one accumulation window exactly as its latch says.
//
// Per window (docs/model.md): for each micro-batch, forward + backward of loss / n_s on this rank's
// samples; per_micro_batch latches sum the K/V rows over TP after every backward; micro-batches
// not marked no_sync take the DP mean of the accumulated gradient. At the boundary: K/V sum over
// TP (deferred/coalesced) -> DP reduction (ZeRO-0 mean all-reduce; ZeRO-1 reduce-scatter into the
// rank's partition) -> global grad norm -> clip -> optimizer step -> (ZeRO-1) all-gather of
// parameters. A latch is never mixed with another mode inside its window.
//
// Torch stays inside engine.cc; this header is torch-free so the runner and the coordinator-side
// code never compile libtorch headers.
// Thread-safety: one thread. Errors (collective timeouts, bad latches) come back as a Status.
#ifndef LATCHKEY_WORKER_TRAIN_ENGINE_H_
#define LATCHKEY_WORKER_TRAIN_ENGINE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "common/step_report.h"
#include "worker/comm/process_groups.h"

namespace latchkey {


struct EngineOptions {
  bool skip_kv_reduction_for_testing = false;
  // When set, after the boundary reduction of window `dump_grads_step` the rank's (local, flat)
  // gradients are written as a safetensors file `dump_grads_dir/grads-rank{R}.safetensors`.
  std::string dump_grads_dir;
  int64_t dump_grads_step = -1;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Runs window latch.window. REQUIRES: windows run in order, each latch valid for this job.
  virtual absl::StatusOr<StepReport> RunWindow(const Latch& latch) = 0;
  // Gathers the shards and (on global rank 0 only) writes an HF checkpoint into `dir`.
  // Every rank must call it (it issues collectives).
  virtual absl::Status SaveCheckpoint(const std::string& dir) = 0;
  // Optimizer state bytes held by this rank (ZeRO-1 partitions it over DP).
  virtual int64_t optimizer_state_bytes() const = 0;
};

// Builds the model shard (from spec.init_from or from the seed), the data source and optimizer.
// Errors name the spec field (e.g. "latchkey.init_from: ..."). `groups` must outlive the engine.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const JobSpec& spec,
                                                     comm::ProcessGroups* groups,
                                                     const EngineOptions& options = {});

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_ENGINE_H_
