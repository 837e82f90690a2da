// What one rank emits while it trains, whoever drives it (standalone or the coordinator):
// the per-step JSONL file, the Prometheus endpoint, and progress lines on stderr (rank 0).
#ifndef LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_
#define LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/latch.h"
#include "worker/comm/collective_stats.h"
#include "worker/train/engine.h"

namespace latchkey {

class WorkerMetrics;
class MetricsEndpoint;

struct OutputOptions {
  std::string metrics_jsonl;  // "{rank}" replaced by the rank; empty = none
  // Prometheus endpoint (builds with metrics only): port -1 = off, 0 = pick a free one.
  std::string metrics_host = "0.0.0.0";
  int metrics_port = -1;
  double linger_seconds = 0;  // keep serving metrics this long after the last step
  bool quiet = false;
};

class RankOutputs {
 public:
  // Opens the JSONL file and starts the endpoint (printing "rank R metrics: http://H:P/metrics"
  // on stderr). `stats` must outlive this object; its listener is set here and cleared in the
  // destructor.
  static absl::StatusOr<std::unique_ptr<RankOutputs>> Open(const OutputOptions& options, int rank,
                                                           comm::CollectiveStats* stats);
  ~RankOutputs();

  void OnStep(const JobSpec& spec, const Latch& latch, const StepReport& report,
              double latch_wait_seconds);
  // After the last step: serves metrics for linger_seconds more.
  void Linger();

 private:
  RankOutputs() = default;
  OutputOptions options_;
  int rank_ = 0;
  comm::CollectiveStats* stats_ = nullptr;
  std::ofstream jsonl_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_
