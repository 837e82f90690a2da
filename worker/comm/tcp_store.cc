// The TCP store: every rank's client is libtorch's c10d::TCPStore, the only use of c10d in
// latchkey (its API changed after libtorch 1.13, so it stays inside this file); rank 0 hosts
// the keys with TcpStoreHost (tcp_store_host.h), which speaks the same wire, against
// libtorch 1.x; against libtorch 2.x c10d's own host (see kOwnHost).
#include <torch/version.h>

#include <optional>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "worker/comm/comm.h"
#include "worker/comm/store.h"
#include "worker/comm/tcp_store_host.h"

namespace latchkey::comm {
namespace {

// c10d reports a missing key by throwing after its timeout, and a lost connection by throwing
// at once; both become a Status here (DeadlineReached tells them apart). A call without a
// deadline (`timeout` unset) can only have lost its connection.
template <typename Fn>
absl::Status Guard(const std::string& what, std::optional<std::chrono::milliseconds> timeout,
                   Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    if (timeout && DeadlineReached(std::chrono::steady_clock::now() - start, *timeout)) {
      return absl::DeadlineExceededError(what + ": " + msg);
    }
    return absl::UnavailableError(what + ": " + msg);
  }
}

class TcpStore final : public Store {
 public:
  TcpStore(std::unique_ptr<TcpStoreHost> host, c10::intrusive_ptr<c10d::TCPStore> store,
           std::string address)
      : host_(std::move(host)), store_(std::move(store)), address_(std::move(address)) {}

  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    return Guard("store " + address_ + " set '" + key + "'", std::nullopt,
                 [&] { store_->set(key, value); });
  }
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override {
    std::vector<uint8_t> out;
    absl::Status st = Guard("store " + address_ + " get '" + key + "'", timeout, [&] {
      // c10d's get waits for the key itself, as long as the store's timeout: a WAIT of our own
      // first only for another timeout (it is one round trip more of the store's host, which
      // serves every rank: a third of a Get's requests).
      if (timeout != store_->getTimeout()) store_->wait({key}, timeout);
      out = store_->get(key);
    });
    if (!st.ok()) return st;
    return out;
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    return Guard("store " + address_ + " wait", timeout, [&] { store_->wait(keys, timeout); });
  }

 private:
  std::unique_ptr<TcpStoreHost> host_;  // rank 0's; outlives store_, its client
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string address_;
};

}  // namespace

// libtorch 1.13's c10d host does not scale past ~1,000 ranks (docs/performance.md, "Rendezvous
// at scale"): there rank 0 hosts the keys with TcpStoreHost, which serves 1.13's wire. The
// clients of libtorch 2.x speak a newer wire (a validation handshake first) that TcpStoreHost
// does not serve, and their own host (libuv-based since 2.4) scales: there c10d hosts.
#if TORCH_VERSION_MAJOR < 2
constexpr bool kOwnHost = true;
#else
constexpr bool kOwnHost = false;
#endif

absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(const std::string& host, int port,
                                                       bool is_host, int world_size,
                                                       std::chrono::milliseconds timeout) {
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError("rendezvous port " + std::to_string(port) +
                                      " outside [1, 65535]");
  }
  const std::string address = host + ":" + std::to_string(port);
  // Rank 0 hosts the keys (kOwnHost: TcpStoreHost, reached through a c10d client like every
  // other rank; else c10d's host inside rank 0's client).
  std::unique_ptr<TcpStoreHost> keys_host;
  if (is_host && kOwnHost) {
    // The previous attempt's rank 0 (another worker, fenced) may hold the port until it exits.
    auto started = TcpStoreHost::Start(port, timeout);
    if (!started.ok()) {
      return absl::Status(started.status().code(), "rendezvous store at " + address + ": " +
                                                       std::string(started.status().message()));
    }
    keys_host = *std::move(started);
  }
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  absl::Status st = Guard("rendezvous store at " + address, timeout, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = is_host && !kOwnHost;
    opts.numWorkers = static_cast<size_t>(world_size);
    opts.waitWorkers = false;
    opts.timeout = timeout;
    tcp = c10::make_intrusive<c10d::TCPStore>(host, opts);
  });
  if (!st.ok()) return st;
  return std::shared_ptr<Store>(
      std::make_shared<TcpStore>(std::move(keys_host), std::move(tcp), address));
}

}  // namespace latchkey::comm
