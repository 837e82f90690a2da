// Prometheus metrics of one worker rank (docs/observability.md) and the HTTP
// endpoint that serves them.
//
// The endpoint is cpp-httplib serving prometheus-cpp's text exposition, not prometheus-cpp's
// civetweb Exposer: civetweb starts its threads with 100 KiB stacks, too small for the static TLS
// of libtorch + OpenBLAS + glog in the worker process (pthread_create fails with EINVAL).
// Thread-safety: every method is thread-safe (prometheus-cpp metrics are atomic).
#ifndef LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_
#define LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "worker/train/engine.h"

namespace prometheus {
class Registry;
}
namespace httplib {
class Server;
}

namespace latchkey {

class WorkerMetrics {
 public:
  WorkerMetrics();
  ~WorkerMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // One collective as counted by comm::CollectiveStats (hook it up with SetListener).
  void ObserveCollective(const std::string& op, const std::string& group, const std::string& tag,
                         int64_t bytes, double seconds);
  // One optimizer step; `rank_tokens` = tokens this rank consumed in it (n_s * MB * S).
  void ObserveStep(const StepReport& report, int64_t rank_tokens);
  void ObserveLatchWait(double seconds);

  // The text exposition (what /metrics returns).
  std::string Serialize() const;

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
};

// Serves GET /metrics on host:port (port 0 = pick a free one) from a background thread until
// destroyed. UNAVAILABLE when the address cannot be bound.
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port,
                                                                const WorkerMetrics* metrics);
  ~MetricsEndpoint();
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_METRICS_WORKER_METRICS_H_
