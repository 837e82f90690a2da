#include "common/metrics_endpoint.h"

#include <httplib.h>

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#error "httplib.h must be included with CPPHTTPLIB_OPENSSL_SUPPORT (link latchkey_metrics_endpoint)"
#endif

namespace latchkey {
namespace {
constexpr size_t kHttpThreads = 32;
}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::function<std::string()> render,
    const std::string& server_name) {
  HttpEndpointOptions options;
  options.host = host;
  options.port = port;
  options.render = std::move(render);
  options.server_name = server_name;
  return Start(std::move(options));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    HttpEndpointOptions options) {
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("HTTP TLS: a certificate and its key go together");
  }
  if (!options.tls_cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                    options.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError("HTTP TLS: cannot load certificate " +
                                        options.tls_cert_file + " with key " +
                                        options.tls_key_file);
    }
    e->server_ = std::move(ssl);
    e->tls_ = true;
  } else {
    e->server_ = std::make_unique<httplib::Server>();
  }
  // Every route is a GET: no request needs a body, so a large one is refused (413) at once.
  e->server_->set_payload_max_length(64 * 1024);
  // cpp-httplib gives each connection a pool thread until it closes or goes quiet for the read
  // (keep-alive) timeout; its default of 8 threads and 5 s let a few idle sockets (a browser's
  // spare keep-alive connections, a stalled client) hold every thread and delay scrapes by
  // seconds. 32 threads, and 2 s before a quiet connection is closed.
  e->server_->new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  e->server_->set_read_timeout(2, 0);
  e->server_->set_keep_alive_timeout(2);
  auto render = options.render;
  e->server_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render ? render() : std::string(), "text/plain; version=0.0.4; charset=utf-8");
  });
  bool has_root = false;
  for (const HttpRoute& route : options.routes) {
    has_root = has_root || route.pattern == "/";
    auto handler = route.handler;
    e->server_->Get(route.pattern, [handler](const httplib::Request& req, httplib::Response& res) {
      HttpRequest in;
      in.path = req.path;
      for (size_t i = 1; i < req.matches.size(); ++i) in.captures.push_back(req.matches[i].str());
      in.authorization = req.get_header_value("Authorization");
      HttpResponse out = handler(in);
      res.status = out.status;
      for (const auto& [name, value] : out.headers) res.set_header(name, value);
      res.set_content(out.body, out.content_type);
    });
  }
  if (!has_root) {
    const std::string name = options.server_name;
    e->server_->Get("/", [name](const httplib::Request&, httplib::Response& res) {
      res.set_content(name + ": metrics at /metrics\n", "text/plain");
    });
  }
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which every process given
  // the same port listens on it and a scrape reaches an arbitrary one of them.
  e->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  if (options.port == 0) {
    e->port_ = e->server_->bind_to_any_port(options.host);
  } else {
    e->port_ = e->server_->bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError("--metrics-port: cannot listen on " + options.host + ":" +
                                  std::to_string(options.port) +
                                  " (in use? each process on a machine needs a port of its own)");
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
