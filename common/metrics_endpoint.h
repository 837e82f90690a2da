// The one HTTP endpoint latchkey serves, in the coordinator and in every worker: GET /metrics
// returns the text exposition that `render` produces at scrape time; further GET routes (the
// coordinator's status page, server/status_page.h) come from a route table.
// Served by cpp-httplib from one background thread (prometheus-cpp's civetweb Exposer cannot
// start its threads inside a process that links libtorch + OpenBLAS: civetweb's 100 KiB thread
// stacks are smaller than their static TLS), and stopped at once on destruction. With a
// certificate and key it serves HTTPS only (cpp-httplib's SSLServer on OpenSSL; every
// translation unit that includes httplib.h gets CPPHTTPLIB_OPENSSL_SUPPORT and the other
// defines Debian's libcpp-httplib was built with from this library's CMake target).
// Thread-safety: `render` and the route handlers are called from the server thread(s); they
// must be thread-safe.
#ifndef LATCHKEY_COMMON_METRICS_ENDPOINT_H_
#define LATCHKEY_COMMON_METRICS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace latchkey {

// What a route handler sees of a GET request.
struct HttpRequest {
  std::string path;
  std::vector<std::string> captures;  // the route pattern's capture groups, in order
  std::string authorization;          // the Authorization header ("" when absent)
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers
};

struct HttpRoute {
  // ECMAScript regex matched against the whole path, e.g. "/jobs/([^/]+)". A route "/" replaces
  // the default answer of GET / (the server name and where the metrics are).
  std::string pattern;
  std::function<HttpResponse(const HttpRequest&)> handler;
};

struct HttpEndpointOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 picks a free one
  // Answers GET / unless a route "/" is given (e.g. "latchkey-coordinator").
  std::string server_name;
  std::function<std::string()> render;  // GET /metrics, never behind a token
  std::vector<HttpRoute> routes;
  // PEM files (the chain, then its key): both set = HTTPS only; both empty = plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class MetricsEndpoint {
 public:
  // Listens on host:port. UNAVAILABLE naming the address when it cannot be bound;
  // INVALID_ARGUMENT naming the files when the certificate or key cannot be loaded.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(HttpEndpointOptions options);
  // Plain HTTP with /metrics only.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port,
                                                                std::function<std::string()> render,
                                                                const std::string& server_name);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  bool tls() const { return tls_; }
  // "http" or "https".
  const char* scheme() const { return tls_ ? "https" : "http"; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_METRICS_ENDPOINT_H_
