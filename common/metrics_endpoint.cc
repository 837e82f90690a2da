#include "common/metrics_endpoint.h"

#include <httplib.h>

namespace latchkey {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::function<std::string()> render,
    const std::string& server_name) {
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->server_ = std::make_unique<httplib::Server>();
  e->server_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  e->server_->Get("/", [server_name](const httplib::Request&, httplib::Response& res) {
    res.set_content(server_name + ": metrics at /metrics\n", "text/plain");
  });
  if (port == 0) {
    e->port_ = e->server_->bind_to_any_port(host);
  } else {
    e->port_ = e->server_->bind_to_port(host, port) ? port : -1;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError("--metrics-port: cannot listen on " + host + ":" +
                                  std::to_string(port));
  }
  httplib::Server* server = e->server_.get();
  e->thread_ = std::thread([server] { server->listen_after_bind(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace latchkey
