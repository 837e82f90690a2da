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
//   latchkey_rank_slowdown{job,rank}          gauge, per rank of a live job: its compute time
//                                             per micro-batch over the other ranks' median
// Every label value but job and rank exists from the start (a zero is a sample too), so
// dashboards and `promtool check metrics` see a stable set; a job's series come with its first
// completed step and go when it ends.
//
// Thread-safety: prometheus-cpp metrics are thread-safe; the observer methods are cheap.
#ifndef LATCHKEY_SERVER_METRICS_H_
#define LATCHKEY_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator.h"

namespace prometheus {
template <typename T>
class Family;
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
  void RankSlowdowns(const std::string& job_id, const std::vector<double>& slowdowns) override;

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
  prometheus::Family<prometheus::Gauge>* slowdown_family_ = nullptr;
  absl::Mutex slowdown_mu_;
  std::map<std::string, std::vector<prometheus::Gauge*>> slowdowns_ ABSL_GUARDED_BY(slowdown_mu_);
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_METRICS_H_
