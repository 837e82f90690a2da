#include "worker/runner/rank_outputs.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_replace.h"
#include "common/error_info.h"
#include "worker/checkpoint/files.h"
#include "worker/train/step_jsonl.h"
#ifdef LATCHKEY_WITH_METRICS
#include "common/metrics_endpoint.h"
#include "worker/metrics/worker_metrics.h"
#endif

namespace latchkey {

#ifdef LATCHKEY_WITH_METRICS
struct RankOutputs::Metrics {
  WorkerMetrics registry;
  std::unique_ptr<MetricsEndpoint> endpoint;
};
#else
struct RankOutputs::Metrics {};
#endif

namespace {

std::string ForRank(const std::string& pattern, int rank) {
  return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)}});
}

// A per-step line's value: printf's `format`, or NaN / Inf / -Inf (never printf's "-nan").
std::string Measure(double v, const char* format) {
  if (!std::isfinite(v)) return NonFiniteName(v);
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankOutputs>> RankOutputs::Open(const OutputOptions& options,
                                                               int rank,
                                                               comm::CollectiveStats* stats) {
  std::unique_ptr<RankOutputs> out(new RankOutputs());
  out->options_ = options;
  out->rank_ = rank;
  out->stats_ = stats;
  if (!options.metrics_jsonl.empty()) {
    const std::string path = ForRank(options.metrics_jsonl, rank);
    out->jsonl_.open(path, options.fresh_jsonl ? std::ios::trunc : std::ios::app);
    if (!out->jsonl_) {
      return absl::PermissionDeniedError("--metrics-jsonl: cannot write '" + path + "'");
    }
  }
  int metrics_port = -1;
  if (options.metrics_port >= 0) {
#ifdef LATCHKEY_WITH_METRICS
    out->metrics_ = std::make_unique<Metrics>();
    const WorkerMetrics* registry = &out->metrics_->registry;
    auto endpoint = MetricsEndpoint::Start(
        options.metrics_host, options.metrics_port, [registry] { return registry->Serialize(); },
        "latchkey-worker");
    if (!endpoint.ok()) return endpoint.status();
    out->metrics_->endpoint = *std::move(endpoint);
    metrics_port = out->metrics_->endpoint->port();
    std::fprintf(stderr, "rank %d metrics: http://%s:%d/metrics\n", rank,
                 options.metrics_host.c_str(), metrics_port);
    WorkerMetrics* m = &out->metrics_->registry;
    stats->SetListener([m](const std::string& op, const std::string& group, const std::string& tag,
                           int64_t bytes,
                           double secs) { m->ObserveCollective(op, group, tag, bytes, secs); });
#else
    return absl::UnimplementedError(
        "--metrics-port: this build has no metrics (built with LATCHKEY_CORE_ONLY)");
#endif
  }
  if (!options.port_file.empty()) {
    const std::string path = ForRank(options.port_file, rank);
    const nlohmann::json info = {{"rank", rank},
                                 {"pid", static_cast<int>(getpid())},
                                 {"metrics_host", options.metrics_host},
                                 {"metrics_port", metrics_port}};
    if (absl::Status st = WriteFileAtomically(path, info.dump() + "\n"); !st.ok()) {
      return absl::Status(st.code(), "--port-file: " + std::string(st.message()));
    }
  }
  return out;
}

RankOutputs::~RankOutputs() {
  if (stats_ != nullptr) stats_->SetListener(nullptr);
}

absl::Status RankOutputs::BeginAttempt(const JobSpec& spec, int rank, int64_t first_step) {
  events_.reset();
  if (rank != 0 || !spec.tensorboard.enabled()) return absl::OkStatus();
  auto events = tensorboard::EventFileWriter::Open(spec.tensorboard.dir, first_step);
  if (!events.ok()) return events.status();
  events_ = *std::move(events);
  return absl::OkStatus();
}

void RankOutputs::OnStep(const JobSpec& spec, const Latch& latch, const StepReport& report,
                         double latch_wait_seconds) {
#ifdef LATCHKEY_WITH_METRICS
  if (metrics_) {
    metrics_->registry.ObserveLatchWait(latch_wait_seconds);
    // This rank's share of an uneven window (latchkey.stragglers.rebalance): its replica's
    // micro-batches, not the window's n, make its tokens and its per-micro-batch reductions.
    const Latch replica = ReplicaLatch(latch, report.replica_micro_batches);
    metrics_->registry.ObserveStep(
        report, static_cast<int64_t>(replica.n) * spec.micro_batch_size * spec.seq_len,
        PlannedKvAllReduces(spec, replica), PlannedReplicatedAllReduces(spec, replica));
  }
#else
  (void)latch;
  (void)latch_wait_seconds;
#endif
  if (jsonl_.is_open()) {
    jsonl_ << StepReportJson(rank_, report) << "\n";
    jsonl_.flush();
  }
  if (events_) {
    if (absl::Status st = events_->WriteScalars(report.step, tensorboard::StepScalars(report));
        !st.ok()) {
      // Losing the curves must not stop the training: said once, then no more event writes.
      std::fprintf(stderr, "rank %d: %s (no more TensorBoard events)\n", rank_,
                   std::string(st.message()).c_str());
      events_.reset();
    }
  }
  if (options_.log_steps || (rank_ == 0 && !options_.quiet)) {
    std::string eval;
    if (report.eval_loss) eval = "  eval_loss " + std::to_string(*report.eval_loss);
    const std::string who = options_.log_steps ? "rank " + std::to_string(rank_) + " " : "";
    std::fprintf(stderr, "%sstep %lld/%lld  loss %s  grad_norm %s  lr %.3g  kv %s x%lld  %.3fs%s\n",
                 who.c_str(), static_cast<long long>(report.step + 1),
                 static_cast<long long>(spec.steps), Measure(report.loss, "%.6f").c_str(),
                 Measure(report.grad_norm, "%.4f").c_str(), report.lr, KvModeName(report.kv_mode),
                 static_cast<long long>(report.kv_allreduce_calls), report.step_seconds,
                 eval.c_str());
  }
}

void RankOutputs::OnCheckpoint(const CheckpointCommit& commit,
                               std::optional<double> background_seconds) {
#ifdef LATCHKEY_WITH_METRICS
  if (metrics_) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    metrics_->registry.ObserveCheckpoint(commit.blocked_seconds, commit.bytes, now);
    if (background_seconds) metrics_->registry.ObserveCheckpointBackground(*background_seconds);
  }
#endif
  if (options_.log_steps || (rank_ == 0 && !options_.quiet)) {
    std::string background;
    if (background_seconds)
      background = "  background " + std::to_string(*background_seconds) + "s";
    std::fprintf(stderr, "checkpoint %s  %lld bytes  %.3fs%s\n", commit.dir.c_str(),
                 static_cast<long long>(commit.bytes), commit.blocked_seconds, background.c_str());
  }
}

void RankOutputs::Linger() {
  if (metrics_ && options_.linger_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.linger_seconds));
  }
}

}  // namespace latchkey
