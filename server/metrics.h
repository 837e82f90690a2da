// Prometheus metrics of the coordinator (docs/observability.md):
//   latchkey_jobs{state}                      gauge, jobs per state
//   latchkey_workers{state}                   gauge, workers per state
//   latchkey_latches_published_total{kv_mode} counter
//   latchkey_stalled_ranks                    gauge, stall verdicts listed on live jobs
//   latchkey_unreachable_peers                gauge, (rank, peer) pairs live jobs' ranks report
//                                             unreachable now (a cut link)
//   latchkey_job_restarts_total               counter, recoveries begun (new attempts)
//   latchkey_boundary_arrival_lag_seconds     histogram, per window: max - min over ranks of
//                                             the time waited in its first boundary collective
// Every label value exists from the start (a zero is a sample too), so dashboards and
// `promtool check metrics` see a stable set.
//
// Thread-safety: prometheus-cpp metrics are thread-safe; the observer methods are cheap.
#ifndef LATCHKEY_SERVER_METRICS_H_
#define LATCHKEY_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/coordinator.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace latchkey {

class CoordinatorMetrics : public CoordinatorObserver {
 public:
  CoordinatorMetrics();
  ~CoordinatorMetrics() override;

  void AddJobs(JobState state, int delta) override;
  void AddWorkers(WorkerState state, int delta) override;
  void LatchPublished(KvMode mode) override;
  void AddStalledRanks(int delta) override;
  void UnreachablePeers(int pairs) override;
  void JobRestarted() override;
  void BoundaryArrivalLag(double seconds) override;
  void GroupCommitted(double seconds, bool lock_held) override;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The text exposition (what /metrics serves).
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::map<JobState, prometheus::Gauge*> jobs_;
  std::map<WorkerState, prometheus::Gauge*> workers_;
  std::map<KvMode, prometheus::Counter*> latches_;
  prometheus::Gauge* stalled_ = nullptr;
  prometheus::Gauge* unreachable_ = nullptr;
  prometheus::Counter* restarts_ = nullptr;
  prometheus::Histogram* arrival_lag_ = nullptr;
  prometheus::Histogram* commit_ = nullptr;
  prometheus::Counter* lock_held_by_commits_ = nullptr;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_METRICS_H_
