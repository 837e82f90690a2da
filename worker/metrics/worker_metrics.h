// Prometheus metrics of one worker rank (docs/observability.md). Served by the common
// MetricsEndpoint (common/metrics_endpoint.h) from Serialize().
// Thread-safety: every method is thread-safe (prometheus-cpp metrics are atomic).
#ifndef LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_
#define LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "common/step_report.h"

namespace prometheus {
class Registry;
}

namespace latchkey {

// The K/V all-reduces the latch of a window plans for this rank (docs/model.md): none unless
// the model is MQA and TP > 1; then per_micro_batch n_s * 2 * n_layer (one per K/V tensor,
// c_attn weight and bias, after every backward), deferred 2 * n_layer, coalesced 1. Computed
// from the latch, never from what the comm layer counted: latchkey_kv_allreduce_planned_total
// next to the observed latchkey_kv_allreduce_total is what the alert on the headline figure
// compares.
int64_t PlannedKvAllReduces(const JobSpec& spec, const Latch& latch);

// Every TP reduction of replicated-parameter gradients the latch plans for this rank
// (docs/memory.md, "Sequence parallelism"): the K/V tensors (2 per layer under MQA) and, with
// tensor_parallel.sequence_parallel, the partial LayerNorm and row-parallel bias tensors (6 per
// layer and ln_f's 2), reduced one collective per tensor: per_micro_batch n_s * tensors,
// deferred tensors, coalesced 1 (none when there are no such tensors or TP is 1). Without
// sequence parallelism it equals PlannedKvAllReduces. Exported as
// latchkey_replicated_allreduce_planned_total beside the observed
// latchkey_replicated_allreduce_calls_total.
int64_t PlannedReplicatedAllReduces(const JobSpec& spec, const Latch& latch);

class WorkerMetrics {
 public:
  WorkerMetrics();
  ~WorkerMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // One collective as counted by comm::CollectiveStats (hook it up with SetListener).
  void ObserveCollective(const std::string& op, const std::string& group, const std::string& tag,
                         int64_t bytes, double seconds);
  // One optimizer step; `rank_tokens` = tokens this rank consumed in it (n_s * MB * S);
  // `kv_planned` = PlannedKvAllReduces of its latch, `replicated_planned` =
  // PlannedReplicatedAllReduces (both counted under the report's kv_mode).
  void ObserveStep(const StepReport& report, int64_t rank_tokens, int64_t kv_planned,
                   int64_t replicated_planned);
  void ObserveLatchWait(double seconds);
  // A committed resumable checkpoint: the training time it blocked, the bytes of all its files
  // and when it was committed (unix seconds).
  void ObserveCheckpoint(double blocked_seconds, int64_t bytes, double unix_seconds);
  // An asynchronous save committed: the time from the end of its staging to its commit.
  void ObserveCheckpointBackground(double seconds);

  // The text exposition (what /metrics returns). latchkey_checkpoint_failures_total is brought
  // up to the process's count of dropped saves (worker/checkpoint/save_failures.h) here.
  std::string Serialize() const;

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_
