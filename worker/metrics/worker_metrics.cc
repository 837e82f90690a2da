#include "worker/metrics/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>

#include "worker/checkpoint/save_failures.h"

namespace latchkey {

namespace {
// Collectives here take ~0.1 ms .. seconds; steps ~10 ms .. minutes.
const prometheus::Histogram::BucketBoundaries kCollectiveBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
const prometheus::Histogram::BucketBoundaries kStepBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                              2.5,  5,     10,   30,  60,   300};
// Checkpoints: ~10 ms (tiny models) .. minutes.
const prometheus::Histogram::BucketBoundaries kCheckpointBuckets = {
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
const prometheus::Histogram::BucketBoundaries kWaitBuckets = {0.00001, 0.0001, 0.001, 0.01,
                                                              0.1,     1,      10};

// Every op and group a collective can carry (docs/observability.md): their series exist at 0
// from process start, so dashboards show zeros rather than no data.
constexpr const char* kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "barrier"};
constexpr const char* kGroups[] = {"world", "tp", "dp"};
constexpr const char* kModes[] = {"per_micro_batch", "deferred", "coalesced"};
}  // namespace

int64_t PlannedKvAllReduces(const JobSpec& spec, const Latch& latch) {
  if (!spec.model.multi_query || spec.tp <= 1 || latch.n < 1) return 0;
  const int64_t per_reduction = 2 * static_cast<int64_t>(spec.model.n_layer);
  switch (latch.kv_mode) {
    case KvMode::kPerMicroBatch:
      return per_reduction * latch.n;
    case KvMode::kDeferred:
      return per_reduction;
    case KvMode::kCoalesced:
      return 1;
  }
  return 0;
}

int64_t PlannedReplicatedAllReduces(const JobSpec& spec, const Latch& latch) {
  if (spec.tp <= 1 || latch.n < 1) return 0;
  const int64_t L = spec.model.n_layer;
  const int64_t tensors =
      (spec.model.multi_query ? 2 * L : 0) + (spec.sequence_parallel ? 6 * L + 2 : 0);
  if (tensors == 0) return 0;
  switch (latch.kv_mode) {
    case KvMode::kPerMicroBatch:
      return tensors * latch.n;
    case KvMode::kDeferred:
      return tensors;
    case KvMode::kCoalesced:
      return 1;
  }
  return 0;
}

struct WorkerMetrics::Families {
  prometheus::Family<prometheus::Counter>* kv_allreduce;
  prometheus::Family<prometheus::Counter>* kv_planned;
  prometheus::Family<prometheus::Counter>* replicated_allreduce;
  prometheus::Family<prometheus::Counter>* replicated_planned;
  prometheus::Family<prometheus::Counter>* collective_calls;
  prometheus::Family<prometheus::Counter>* collective_bytes;
  prometheus::Family<prometheus::Histogram>* collective_seconds;
  prometheus::Histogram* step_seconds;
  prometheus::Counter* optimizer_steps;
  prometheus::Counter* tokens;
  prometheus::Gauge* loss;
  prometheus::Gauge* grad_norm;
  prometheus::Gauge* optimizer_state_bytes;
  prometheus::Gauge* peak_memory_bytes;
  prometheus::Gauge* activation_memory_bytes;
  prometheus::Gauge* reserved_memory_bytes;
  prometheus::Histogram* latch_wait;
  prometheus::Gauge* learning_rate;
  prometheus::Gauge* eval_loss;
  prometheus::Counter* eval_collectives;
  prometheus::Histogram* checkpoint_seconds;
  prometheus::Histogram* checkpoint_background_seconds;
  prometheus::Counter* checkpoint_bytes;
  prometheus::Gauge* last_checkpoint;
  // Follows the process's count (worker/checkpoint/save_failures.h) when serialized.
  prometheus::Counter* checkpoint_failures;
  std::mutex failures_mu;
  int64_t failures_exported = 0;  // guarded by failures_mu
};

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()), f_(std::make_unique<Families>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  f_->kv_allreduce = &BuildCounter()
                          .Name("latchkey_kv_allreduce_total")
                          .Help("Replicated K/V gradient all-reduces issued over TP, by kv_mode")
                          .Register(*registry_);
  f_->kv_planned = &BuildCounter()
                        .Name("latchkey_kv_allreduce_planned_total")
                        .Help("K/V all-reduces the windows' latches planned for this rank, by mode")
                        .Register(*registry_);
  f_->replicated_allreduce =
      &BuildCounter()
           .Name("latchkey_replicated_allreduce_calls_total")
           .Help(
               "TP reductions of replicated-parameter gradients (K/V and sequence-parallel), by "
               "kv_mode")
           .Register(*registry_);
  f_->replicated_planned =
      &BuildCounter()
           .Name("latchkey_replicated_allreduce_planned_total")
           .Help("Replicated-gradient TP reductions the windows' latches planned, by mode")
           .Register(*registry_);
  for (const char* mode : kModes) {
    f_->kv_allreduce->Add({{"mode", mode}});  // present (0) before the first step
    f_->kv_planned->Add({{"mode", mode}});
    f_->replicated_allreduce->Add({{"mode", mode}});
    f_->replicated_planned->Add({{"mode", mode}});
  }
  f_->collective_calls = &BuildCounter()
                              .Name("latchkey_collective_calls_total")
                              .Help("Collectives issued by this rank, by op and group")
                              .Register(*registry_);
  f_->collective_bytes = &BuildCounter()
                              .Name("latchkey_collective_bytes_total")
                              .Help("Payload bytes of the collectives issued by this rank")
                              .Register(*registry_);
  f_->collective_seconds = &BuildHistogram()
                                .Name("latchkey_collective_seconds")
                                .Help("Wall time of one collective")
                                .Register(*registry_);
  for (const char* op : kOps) {
    for (const char* group : kGroups) {
      const prometheus::Labels labels = {{"op", op}, {"group", group}};
      f_->collective_calls->Add(labels);
      f_->collective_bytes->Add(labels);
      f_->collective_seconds->Add(labels, kCollectiveBuckets);
    }
  }
  f_->step_seconds = &BuildHistogram()
                          .Name("latchkey_step_seconds")
                          .Help("Wall time of one optimizer step (window) on this rank")
                          .Register(*registry_)
                          .Add({}, kStepBuckets);
  f_->optimizer_steps = &BuildCounter()
                             .Name("latchkey_optimizer_steps_total")
                             .Help("Optimizer steps completed")
                             .Register(*registry_)
                             .Add({});
  f_->tokens = &BuildCounter()
                    .Name("latchkey_tokens_total")
                    .Help("Tokens this rank consumed")
                    .Register(*registry_)
                    .Add({});
  f_->loss = &BuildGauge()
                  .Name("latchkey_loss")
                  .Help("Mean loss of the last window across DP")
                  .Register(*registry_)
                  .Add({});
  f_->grad_norm = &BuildGauge()
                       .Name("latchkey_grad_norm")
                       .Help("Global gradient norm of the last window, before clipping")
                       .Register(*registry_)
                       .Add({});
  f_->optimizer_state_bytes = &BuildGauge()
                                   .Name("latchkey_optimizer_state_bytes")
                                   .Help("Optimizer state held by this rank (ZeRO-1: partition)")
                                   .Register(*registry_)
                                   .Add({});
  f_->peak_memory_bytes =
      &BuildGauge()
           .Name("latchkey_peak_memory_bytes")
           .Help("High-water mark of the bytes this rank's tensors held during the last step")
           .Register(*registry_)
           .Add({});
  f_->activation_memory_bytes =
      &BuildGauge()
           .Name("latchkey_activation_memory_bytes")
           .Help("Bytes the last step's last micro-batch forward left allocated for its backward")
           .Register(*registry_)
           .Add({});
  f_->reserved_memory_bytes =
      &BuildGauge()
           .Name("latchkey_reserved_memory_bytes")
           .Help("CUDA caching allocator's reserved bytes at the end of the last step (0 on CPU)")
           .Register(*registry_)
           .Add({});
  f_->latch_wait = &BuildHistogram()
                        .Name("latchkey_latch_wait_seconds")
                        .Help("Time a window waited for its latch")
                        .Register(*registry_)
                        .Add({}, kWaitBuckets);
  f_->learning_rate = &BuildGauge()
                           .Name("latchkey_learning_rate")
                           .Help("Learning rate of the last optimizer step (the schedule's value)")
                           .Register(*registry_)
                           .Add({});
  f_->eval_loss = &BuildGauge()
                       .Name("latchkey_eval_loss")
                       .Help("Evaluation loss of the last evaluation (0 before the first)")
                       .Register(*registry_)
                       .Add({});
  f_->eval_collectives =
      &BuildCounter()
           .Name("latchkey_eval_collective_calls_total")
           .Help("Collectives issued for evaluation (tag eval), all ops and groups")
           .Register(*registry_)
           .Add({});
  f_->checkpoint_seconds =
      &BuildHistogram()
           .Name("latchkey_checkpoint_seconds")
           .Help(
               "Training time one resumable checkpoint blocked on this rank (asynchronous: the "
               "staging copy; synchronous: through the commit)")
           .Register(*registry_)
           .Add({}, kCheckpointBuckets);
  f_->checkpoint_background_seconds =
      &BuildHistogram()
           .Name("latchkey_checkpoint_background_seconds")
           .Help(
               "Time from the staging of one asynchronous checkpoint to its commit (written, "
               "fsynced and checksummed by a background thread, then committed)")
           .Register(*registry_)
           .Add({}, kCheckpointBuckets);
  f_->checkpoint_bytes =
      &BuildCounter()
           .Name("latchkey_checkpoint_bytes_total")
           .Help("Bytes of the committed resumable checkpoints (all ranks' files)")
           .Register(*registry_)
           .Add({});
  f_->last_checkpoint =
      &BuildGauge()
           .Name("latchkey_last_checkpoint_timestamp_seconds")
           .Help("Unix time of the last committed resumable checkpoint (0 before the first)")
           .Register(*registry_)
           .Add({});
  f_->checkpoint_failures =
      &BuildCounter()
           .Name("latchkey_checkpoint_failures_total")
           .Help(
               "Resumable checkpoint saves that failed for lack of room (ENOSPC, EDQUOT, EFBIG) "
               "and were dropped while training went on")
           .Register(*registry_)
           .Add({});
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::ObserveCollective(const std::string& op, const std::string& group,
                                      const std::string& tag, int64_t bytes, double seconds) {
  if (tag == kEvalTag) f_->eval_collectives->Increment();
  const prometheus::Labels labels = {{"op", op}, {"group", group}};
  f_->collective_calls->Add(labels).Increment();
  f_->collective_bytes->Add(labels).Increment(static_cast<double>(bytes));
  f_->collective_seconds->Add(labels, kCollectiveBuckets).Observe(seconds);
}

void WorkerMetrics::ObserveStep(const StepReport& r, int64_t rank_tokens, int64_t kv_planned,
                                int64_t replicated_planned) {
  const prometheus::Labels mode = {{"mode", KvModeName(r.kv_mode)}};
  f_->kv_allreduce->Add(mode).Increment(static_cast<double>(r.kv_allreduce_calls));
  f_->kv_planned->Add(mode).Increment(static_cast<double>(kv_planned));
  f_->replicated_allreduce->Add(mode).Increment(static_cast<double>(r.replicated_allreduce_calls));
  f_->replicated_planned->Add(mode).Increment(static_cast<double>(replicated_planned));
  f_->step_seconds->Observe(r.step_seconds);
  // A diverged step ran its window but applied no update (common/step_report.h StepDiverged);
  // its loss and grad norm gauges say why (NaN or ±Inf, as Prometheus writes them).
  if (!StepDiverged(r)) f_->optimizer_steps->Increment();
  f_->tokens->Increment(static_cast<double>(rank_tokens));
  f_->loss->Set(r.loss);
  f_->grad_norm->Set(r.grad_norm);
  f_->optimizer_state_bytes->Set(static_cast<double>(r.optimizer_state_bytes));
  f_->peak_memory_bytes->Set(static_cast<double>(r.peak_memory_bytes));
  f_->activation_memory_bytes->Set(static_cast<double>(r.activation_memory_bytes));
  f_->reserved_memory_bytes->Set(static_cast<double>(r.reserved_memory_bytes));
  f_->learning_rate->Set(r.lr);
  if (r.eval_loss) f_->eval_loss->Set(*r.eval_loss);
}

void WorkerMetrics::ObserveLatchWait(double seconds) { f_->latch_wait->Observe(seconds); }

void WorkerMetrics::ObserveCheckpoint(double blocked_seconds, int64_t bytes, double unix_seconds) {
  f_->checkpoint_seconds->Observe(blocked_seconds);
  f_->checkpoint_bytes->Increment(static_cast<double>(bytes));
  f_->last_checkpoint->Set(unix_seconds);
}

void WorkerMetrics::ObserveCheckpointBackground(double seconds) {
  f_->checkpoint_background_seconds->Observe(seconds);
}

std::string WorkerMetrics::Serialize() const {
  {
    std::lock_guard<std::mutex> lock(f_->failures_mu);
    const int64_t now = CheckpointSaveFailures();
    if (now > f_->failures_exported) {
      f_->checkpoint_failures->Increment(static_cast<double>(now - f_->failures_exported));
      f_->failures_exported = now;
    }
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace latchkey
