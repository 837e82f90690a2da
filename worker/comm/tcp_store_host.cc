#include "worker/comm/tcp_store_host.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace latchkey::comm {
namespace {

// c10d 1.13's query types and one-byte answers (its TCPStore.cpp), in wire order.
enum Query : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};
constexpr uint8_t kReady = 0, kNotReady = 1;  // CHECK
constexpr uint8_t kStopWaiting = 0;           // WAIT
// The largest backlog asked for; the kernel caps it at net.core.somaxconn.
constexpr int kListenBacklog = 65535;
// A key or value longer than this, or a CHECK/WAIT of more keys, is a malformed query: the
// connection is closed before anything is allocated for it. The largest value latchkey sets is
// a mesh exchange's transposed value, 6 bytes a rank (100 KB at 16,384 ranks).
constexpr uint64_t kMaxLength = uint64_t{64} << 20;
constexpr uint64_t kMaxKeys = uint64_t{1} << 20;

using Bytes = std::vector<uint8_t>;

// Reads one query's fields from a connection's buffered input; any read past the end marks the
// query incomplete (more bytes needed), a length past kMaxLength marks it malformed.
class Reader {
 public:
  Reader(const Bytes& in, size_t at) : in_(in), at_(at) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U64(uint64_t* v) { return Raw(v, sizeof(*v)); }
  bool Str(std::string* s) {
    Bytes b;
    if (!Vec(&b)) return false;
    s->assign(b.begin(), b.end());
    return true;
  }
  bool Vec(Bytes* b) {
    uint64_t n = 0;
    if (!U64(&n)) return false;
    if (n > kMaxLength) {
      malformed_ = true;
      return false;
    }
    if (in_.size() - at_ < n) return false;
    b->assign(in_.begin() + static_cast<std::ptrdiff_t>(at_),
              in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return true;
  }
  size_t at() const { return at_; }
  size_t left() const { return in_.size() - at_; }
  bool malformed() const { return malformed_; }

 private:
  bool Raw(void* v, size_t n) {
    if (in_.size() - at_ < n) return false;
    std::memcpy(v, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  const Bytes& in_;
  size_t at_;
  bool malformed_ = false;
};

struct Conn {
  Bytes in;
  size_t in_at = 0;  // parsed up to here
  Bytes out;
  size_t out_at = 0;  // written up to here
  bool want_out = false;
  size_t awaited = 0;  // keys of its WAIT not yet set
};

class Server {
 public:
  Server(int listen_fd, int epoll_fd, int wake_fd)
      : listen_fd_(listen_fd), epoll_fd_(epoll_fd), wake_fd_(wake_fd) {}

  void Run() {
    std::vector<epoll_event> events(1024);
    for (;;) {
      const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd_) return CloseAll();
        if (fd == listen_fd_) {
          AcceptAll();
          continue;
        }
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        bool ok = true;
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ok = ReadAndServe(fd, &it->second);
        if (ok && (events[i].events & EPOLLOUT)) ok = Flush(fd, &it->second);
        if (!ok) Close(fd);
      }
    }
  }

 private:
  void AcceptAll() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: all taken; EMFILE and the like: the kernel keeps them queued
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        continue;
      }
      conns_[fd] = Conn{};
    }
  }

  // Reads what is there, answers every complete query. False: close the connection.
  bool ReadAndServe(int fd, Conn* c) {
    uint8_t buf[65536];
    bool open = true;  // what a client sent before it went away is still served
    while (open) {
      const ssize_t got = recv(fd, buf, sizeof(buf), 0);
      if (got > 0) {
        c->in.insert(c->in.end(), buf, buf + got);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        open = false;
      } else if (errno != EINTR) {
        break;
      }
    }
    for (;;) {
      Reader r(c->in, c->in_at);
      const int served = ServeOne(fd, c, &r);
      if (served < 0) return false;
      if (served == 0) break;
      c->in_at = r.at();
    }
    if (c->in_at == c->in.size()) {
      c->in.clear();
      c->in_at = 0;
    } else if (c->in_at > 65536) {
      c->in.erase(c->in.begin(), c->in.begin() + static_cast<std::ptrdiff_t>(c->in_at));
      c->in_at = 0;
    }
    return Flush(fd, c) && open;
  }

  // 1: served one query; 0: incomplete; -1: malformed or refused.
  int ServeOne(int fd, Conn* c, Reader* r) {
    uint8_t q = 0;
    if (!r->U8(&q)) return 0;
    auto incomplete = [&] { return r->malformed() ? -1 : 0; };
    switch (q) {
      case kSet: {
        std::string key;
        Bytes value;
        if (!r->Str(&key) || !r->Vec(&value)) return incomplete();
        Set(key, std::move(value));
        return 1;
      }
      case kCompareSet: {
        std::string key;
        Bytes expected, desired;
        if (!r->Str(&key) || !r->Vec(&expected) || !r->Vec(&desired)) return incomplete();
        auto it = data_.find(key);
        if (it == data_.end()) {
          if (!expected.empty()) return SendVec(c, expected), 1;
          SendVec(c, desired);
          Set(key, std::move(desired));
          return 1;
        }
        if (it->second == expected) it->second = std::move(desired);
        SendVec(c, it->second);
        return 1;
      }
      case kGet: {
        std::string key;
        if (!r->Str(&key)) return incomplete();
        auto it = data_.find(key);
        if (it == data_.end()) return -1;
        SendVec(c, it->second);
        return 1;
      }
      case kAdd: {
        std::string key;
        uint64_t delta = 0;
        if (!r->Str(&key) || !r->U64(&delta)) return incomplete();
        int64_t v = static_cast<int64_t>(delta);
        if (auto it = data_.find(key); it != data_.end()) {
          v += std::strtoll(std::string(it->second.begin(), it->second.end()).c_str(), nullptr, 10);
        }
        const std::string s = std::to_string(v);
        Send(c, &v, sizeof(v));
        Set(key, Bytes(s.begin(), s.end()));
        return 1;
      }
      case kCheck:
      case kWait: {
        uint64_t n = 0;
        if (!r->U64(&n)) return 0;
        if (n > kMaxKeys) return -1;
        // Each key is at least its 8-byte length: not all here yet, nothing is allocated.
        if (r->left() < 8 * n) return 0;
        std::vector<std::string> keys(n);
        for (std::string& k : keys) {
          if (!r->Str(&k)) return incomplete();
        }
        size_t missing = 0;
        for (const std::string& k : keys) missing += data_.count(k) == 0 ? 1 : 0;
        if (q == kCheck) {
          const uint8_t a = missing == 0 ? kReady : kNotReady;
          Send(c, &a, 1);
        } else if (missing == 0) {
          Send(c, &kStopWaiting, 1);
        } else {
          for (const std::string& k : keys) {
            if (data_.count(k) == 0) waiting_[k].push_back(fd);
          }
          c->awaited = missing;
        }
        return 1;
      }
      case kGetNumKeys: {
        const auto n = static_cast<int64_t>(data_.size());
        Send(c, &n, sizeof(n));
        return 1;
      }
      case kDeleteKey: {
        std::string key;
        if (!r->Str(&key)) return incomplete();
        const auto n = static_cast<int64_t>(data_.erase(key));
        Send(c, &n, sizeof(n));
        return 1;
      }
      default:  // kWatchKey (not served) or not a query
        return -1;
    }
  }

  void Set(const std::string& key, Bytes value) {
    data_[key] = std::move(value);
    auto w = waiting_.find(key);
    if (w == waiting_.end()) return;
    std::vector<int> fds = std::move(w->second);
    waiting_.erase(w);
    for (int fd : fds) {
      auto it = conns_.find(fd);
      if (it == conns_.end() || it->second.awaited == 0) continue;
      if (--it->second.awaited == 0) {
        Send(&it->second, &kStopWaiting, 1);
        // A failed write shows as EPOLLERR/EPOLLHUP on that connection, which closes it then
        // (not here: it may be the connection being served).
        (void)Flush(fd, &it->second);
      }
    }
  }

  static void Send(Conn* c, const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    c->out.insert(c->out.end(), b, b + n);
  }
  static void SendVec(Conn* c, const Bytes& v) {
    const uint64_t n = v.size();
    Send(c, &n, sizeof(n));
    Send(c, v.data(), v.size());
  }

  // Writes what is queued; waits for EPOLLOUT when the socket is full. False: close.
  bool Flush(int fd, Conn* c) {
    while (c->out_at < c->out.size()) {
      const ssize_t n =
          send(fd, c->out.data() + c->out_at, c->out.size() - c->out_at, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_at += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return false;
    }
    const bool want = c->out_at < c->out.size();
    if (!want) {
      c->out.clear();
      c->out_at = 0;
    }
    if (want != c->want_out) {
      epoll_event ev{};
      ev.events = want ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
      c->want_out = want;
    }
    return true;
  }

  void Close(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    if (it->second.awaited > 0) {
      for (auto w = waiting_.begin(); w != waiting_.end();) {
        auto& v = w->second;
        v.erase(std::remove(v.begin(), v.end(), fd), v.end());
        w = v.empty() ? waiting_.erase(w) : std::next(w);
      }
    }
    conns_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
  }

  void CloseAll() {
    for (auto& [fd, c] : conns_) close(fd);
    conns_.clear();
  }

  const int listen_fd_, epoll_fd_, wake_fd_;
  std::unordered_map<int, Conn> conns_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::vector<int>> waiting_;  // key -> connections in WAIT
};

int ListenOn(int port, std::string* err, bool* in_use) {
  *in_use = false;
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc = -1;
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      a.sin6_addr = in6addr_any;
      rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (rc == 0 && listen(fd, kListenBacklog) == 0) return fd;
    *err = std::string(family == AF_INET6 ? "[::]:" : "0.0.0.0:") + std::to_string(port) + ": " +
           std::strerror(errno);
    const int bind_errno = errno;
    close(fd);
    if (bind_errno == EADDRINUSE) {  // IPv4 alone would collide too
      *in_use = true;
      break;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreHost>> TcpStoreHost::Start(
    int port, std::chrono::milliseconds wait_for_port) {
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError("store port " + std::to_string(port) + " outside [1, 65535]");
  }
  std::string err = "no socket";
  bool in_use = false;
  const auto until = std::chrono::steady_clock::now() + wait_for_port;
  int listen_fd = ListenOn(port, &err, &in_use);
  while (listen_fd < 0 && in_use && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    listen_fd = ListenOn(port, &err, &in_use);
  }
  if (listen_fd < 0) return absl::UnavailableError("store host cannot listen on " + err);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd;
  bool ok =
      epoll_fd >= 0 && wake_fd >= 0 && epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev) == 0;
  ev.data.fd = wake_fd;
  ok = ok && epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) == 0;
  if (!ok) {
    const std::string why = std::strerror(errno);
    for (int fd : {listen_fd, epoll_fd, wake_fd}) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError("store host: epoll: " + why);
  }
  return std::unique_ptr<TcpStoreHost>(new TcpStoreHost(listen_fd, epoll_fd, wake_fd));
}

TcpStoreHost::TcpStoreHost(int listen_fd, int epoll_fd, int wake_fd)
    : listen_fd_(listen_fd), epoll_fd_(epoll_fd), wake_fd_(wake_fd) {
  thread_ = std::thread([this] { Serve(); });
}

void TcpStoreHost::Serve() { Server(listen_fd_, epoll_fd_, wake_fd_).Run(); }

TcpStoreHost::~TcpStoreHost() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(listen_fd_);
  close(epoll_fd_);
  close(wake_fd_);
}

}  // namespace latchkey::comm
