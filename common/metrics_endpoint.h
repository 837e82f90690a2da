// The one HTTP endpoint latchkey serves Prometheus metrics from, in the coordinator and in every
// worker: GET /metrics returns the text exposition that `render` produces at scrape time.
// Served by cpp-httplib from one background thread (prometheus-cpp's civetweb Exposer cannot
// start its threads inside a process that links libtorch + OpenBLAS: civetweb's 100 KiB thread
// stacks are smaller than their static TLS), and stopped at once on destruction.
// Thread-safety: `render` is called from the server thread; it must be thread-safe.
#ifndef LATCHKEY_COMMON_METRICS_ENDPOINT_H_
#define LATCHKEY_COMMON_METRICS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace latchkey {

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0 picks a free one). `server_name` answers GET / (e.g.
  // "latchkey-coordinator"). UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port,
                                                                std::function<std::string()> render,
                                                                const std::string& server_name);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_METRICS_ENDPOINT_H_
