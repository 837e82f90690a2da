#include "common/metrics_endpoint.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#error "httplib.h must be included with CPPHTTPLIB_OPENSSL_SUPPORT (link latchkey_metrics_endpoint)"
#endif

namespace latchkey {
namespace {

constexpr size_t kHttpThreads = 32;      // standing threads
constexpr size_t kMaxHttpThreads = 512;  // standing and spare threads together
constexpr auto kSpareIdle = std::chrono::seconds(10);

// cpp-httplib hands each accepted connection to its task queue, and the task holds its thread
// until the connection closes or stays quiet for the read (keep-alive) timeout. A fixed pool
// lets that many idle sockets delay every scrape by the timeout; this one keeps `standing`
// threads and starts a spare one for a connection that finds every thread busy (up to `max`),
// so a quiet socket costs a thread for 2 s, never a scrape's wait. A spare exits after
// kSpareIdle without work; it is joined by the next enqueue or by shutdown.
class GrowingPool : public httplib::TaskQueue {
 public:
  GrowingPool(size_t standing, size_t max) : max_(max) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < standing; ++i) StartLocked(/*spare=*/false);
  }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    JoinFinishedLocked();
    jobs_.push_back(std::move(fn));
    if (idle_ < jobs_.size() && threads_.size() < max_) StartLocked(/*spare=*/true);
    cv_.notify_one();
  }

  void shutdown() override {
    std::list<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (std::thread& t : threads) t.join();
  }

 private:
  void StartLocked(bool spare) {
    threads_.emplace_back([this, spare] { Work(spare); });
  }

  // Joins the spares that said they are done (they released the lock and only return).
  void JoinFinishedLocked() {
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (std::find(finished_.begin(), finished_.end(), it->get_id()) != finished_.end()) {
        it->join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    finished_.clear();
  }

  void Work(bool spare) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto ready = [this] { return shutdown_ || !jobs_.empty(); };
    for (;;) {
      ++idle_;
      const bool woke =
          spare ? cv_.wait_for(lock, kSpareIdle, ready) : (cv_.wait(lock, ready), true);
      --idle_;
      if (!woke && !shutdown_) {
        finished_.push_back(std::this_thread::get_id());
        return;
      }
      if (jobs_.empty()) return;  // shut down, nothing left
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  std::vector<std::thread::id> finished_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

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
  // seconds. 32 standing threads and spares up to 512 (GrowingPool), and 2 s before a quiet
  // connection is closed.
  e->server_->new_task_queue = [] { return new GrowingPool(kHttpThreads, kMaxHttpThreads); };
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
