#include "worker/session/peer_prober.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// The first IPv4/IPv6 address of `host`, as text; "" when it does not resolve.
std::string Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  char buf[INET6_ADDRSTRLEN] = {0};
  std::string out;
  if (res->ai_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
    out = buf;
  } else if (res->ai_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, buf,
              sizeof(buf));
    out = buf;
  }
  freeaddrinfo(res);
  return out;
}

// A non-blocking connect to ip:port started; -1 with `*failed` set when it failed at once
// (a blackhole route, no route to the host).
int StartConnect(const std::string& ip, int port, bool* failed) {
  *failed = false;
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
  if (ip.find(':') != std::string::npos) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, ip.c_str(), &a6->sin6_addr) != 1) return *failed = true, -1;
    len = sizeof(*a6);
    family = AF_INET6;
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, ip.c_str(), &a4->sin_addr) != 1) return *failed = true, -1;
    len = sizeof(*a4);
  }
  const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return *failed = true, -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) return fd;  // at once
  if (errno == EINPROGRESS) return fd;
  // Refused at once: the host answered.
  const bool refused = errno == ECONNREFUSED;
  close(fd);
  *failed = !refused;
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerProber>> PeerProber::Start(PeerProberOptions options) {
  std::unique_ptr<PeerProber> p(new PeerProber(std::move(options)));
  const std::string ip = p->opt_.host.empty() ? "" : Resolve(p->opt_.host);
  const bool v6 = ip.find(':') != std::string::npos;
  p->listen_fd_ = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (p->listen_fd_ < 0)
    return absl::InternalError(absl::StrCat("probe socket: ", strerror(errno)));
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (v6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    inet_pton(AF_INET6, ip.c_str(), &a6->sin6_addr);
    len = sizeof(*a6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!ip.empty()) inet_pton(AF_INET, ip.c_str(), &a4->sin_addr);
    len = sizeof(*a4);
  }
  if (bind(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(p->listen_fd_, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("probe port on ", ip.empty() ? "*" : ip, ": ", strerror(errno)));
  }
  if (getsockname(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    p->port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                        : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (pipe2(p->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("probe wake pipe: ", strerror(errno)));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

PeerProber::~PeerProber() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void PeerProber::SetPeers(int self, const PeerList& peers) {
  absl::MutexLock lock(&mu_);
  if (peers.version == version_) return;
  version_ = peers.version;
  peers_.clear();
  for (const PeerAddress& p : peers.peers) {
    if (p.rank != self) peers_.push_back(p);
  }
  peer_ips_.clear();
  latest_.reset();
  unreachable_since_.clear();
}

int64_t PeerProber::peers_version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

void PeerProber::SetActive(bool active) {
  bool woke = false;
  {
    absl::MutexLock lock(&mu_);
    woke = active && !active_;
    active_ = active;
  }
  if (woke) (void)!write(wake_[1], "x", 1);
}

std::optional<Reachability> PeerProber::Latest(absl::Duration max_age) const {
  absl::MutexLock lock(&mu_);
  if (!latest_ || absl::Now() - latest_time_ > max_age) return std::nullopt;
  return latest_;
}

uint64_t PeerProber::rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

void PeerProber::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    close(fd);
  }
}

void PeerProber::Loop() {
  absl::Time next = absl::InfinitePast();
  while (true) {
    bool active = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      active = active_ && !peers_.empty();
    }
    if (active && absl::Now() >= next) {
      Round();
      next = absl::Now() + opt_.every;
    }
    const absl::Duration wait =
        active ? std::max(absl::ZeroDuration(), next - absl::Now()) : absl::Milliseconds(200);
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    (void)poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    if (fds[0].revents & POLLIN) Accept();
    if (fds[1].revents & POLLIN) {
      char buf[16];
      while (read(wake_[0], buf, sizeof(buf)) > 0) {
      }
      next = absl::InfinitePast();
    }
  }
}

void PeerProber::Round() {
  std::vector<PeerAddress> peers;
  std::vector<std::string> ips;
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    peers = peers_;
    ips = peer_ips_;
    version = version_;
  }
  if (ips.size() != peers.size()) {  // resolved once per peer list, outside the lock
    ips.clear();
    for (const PeerAddress& p : peers) ips.push_back(Resolve(p.host));
  }
  std::vector<int> fds(peers.size(), -1);
  std::vector<bool> reachable(peers.size(), false);
  for (size_t i = 0; i < peers.size(); ++i) {
    bool failed = false;
    fds[i] = ips[i].empty() ? -1 : StartConnect(ips[i], peers[i].port, &failed);
    if (fds[i] < 0) reachable[i] = !failed && !ips[i].empty();
  }
  const absl::Time until = absl::Now() + opt_.deadline;
  while (absl::Now() < until) {
    std::vector<pollfd> polled;
    std::vector<size_t> which;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] >= 0) {
        polled.push_back({fds[i], POLLOUT, 0});
        which.push_back(i);
      }
    }
    if (polled.empty()) break;
    polled.push_back({listen_fd_, POLLIN, 0});  // peers probe this rank meanwhile
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now())) + 1;
    if (poll(polled.data(), polled.size(), ms) <= 0) break;
    if (polled.back().revents & POLLIN) Accept();
    for (size_t k = 0; k + 1 < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      const size_t i = which[k];
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
      reachable[i] = err == 0 || err == ECONNREFUSED;
      close(fds[i]);
      fds[i] = -1;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);  // no answer within the deadline: unreachable
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (version != version_) return;  // the peers changed meanwhile
  peer_ips_ = ips;
  Reachability r;
  r.peers_version = version;
  r.probed = static_cast<int>(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    if (reachable[i]) {
      unreachable_since_.erase(peers[i].rank);
      continue;
    }
    auto [it, added] = unreachable_since_.emplace(peers[i].rank, now);
    r.unreachable.push_back(peers[i].rank);
    r.unreachable_seconds =
        std::max(r.unreachable_seconds, absl::ToDoubleSeconds(now - it->second));
  }
  latest_ = std::move(r);
  latest_time_ = now;
  ++rounds_;
}

std::optional<uint64_t> PeerProber::PeerBytes(int exclude_port) const {
  std::set<std::string> ips;
  {
    absl::MutexLock lock(&mu_);
    ips.insert(peer_ips_.begin(), peer_ips_.end());
  }
  ips.erase("");
  if (ips.empty()) return std::nullopt;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  uint64_t total = 0;
  bool any = false;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = atoi(e->d_name);
    if (fd == dirfd(dir) || fd == listen_fd_) continue;
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage peer{};
    len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    int port = 0;
    if (peer.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
      port = ntohs(a->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
      port = ntohs(a->sin6_port);
    } else {
      continue;
    }
    if (port == exclude_port || ips.count(buf) == 0) continue;
    tcp_info info{};
    len = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    total += info.tcpi_bytes_acked + info.tcpi_bytes_received;
    any = true;
  }
  closedir(dir);
  if (!any) return std::nullopt;
  return total;
}

}  // namespace latchkey
