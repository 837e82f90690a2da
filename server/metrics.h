// Prometheus metrics of the coordinator (docs/observability.md):
//   latchkey_jobs{state}                      gauge, jobs per state
//   latchkey_workers{state}                   gauge, workers per state
//   latchkey_latches_published_total{kv_mode} counter
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

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The text exposition (what /metrics serves).
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::map<JobState, prometheus::Gauge*> jobs_;
  std::map<WorkerState, prometheus::Gauge*> workers_;
  std::map<KvMode, prometheus::Counter*> latches_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_METRICS_H_
