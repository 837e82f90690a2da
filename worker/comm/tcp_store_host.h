// The host side of the TCP store: rank 0 serves the store's keys to every rank's c10d TCPStore
// client (libtorch 1.13's wire protocol, unchanged: the clients are c10d's own).
//
// It replaces c10d's own host, whose one thread polls every connection on each request and
// accepts one connection per poll: with 4,096 ranks (8,192 connections: c10d clients open two)
// a request waited milliseconds and forming a DP group took minutes, and its backlog of 2,048
// dropped connections (docs/performance.md, "Rendezvous at scale"). This one waits on epoll,
// accepts every pending connection at once, listens with the largest backlog the kernel allows
// (net.core.somaxconn) and writes large values without blocking the others.
//
// Queries served (c10d 1.13): SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY.
// WATCH_KEY (c10d's watchKey, which latchkey does not use) closes that connection, as does a
// malformed query or a GET of a missing key (c10d's host drops such a connection too). A query
// naming a key or value over 64 MiB, or more than 2^20 keys, is malformed: a lying length
// closes its connection before anything is allocated, and the host serves the others on.
// Thread-safety: Start and the destructor from one thread; the serving thread is internal.
#ifndef LATCHKEY_WORKER_COMM_TCP_STORE_HOST_H_
#define LATCHKEY_WORKER_COMM_TCP_STORE_HOST_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"

namespace latchkey::comm {

class TcpStoreHost {
 public:
  // Listens on every address (IPv6 with IPv4 mapped, or IPv4 alone) at `port` (1..65535).
  // UNAVAILABLE when the port cannot be bound. A port in use is tried again every 100 ms for
  // up to `wait_for_port`: the previous attempt's rank 0, another process, may still hold it
  // until it leaves the fenced attempt.
  static absl::StatusOr<std::unique_ptr<TcpStoreHost>> Start(
      int port, std::chrono::milliseconds wait_for_port = std::chrono::milliseconds(0));
  ~TcpStoreHost();
  TcpStoreHost(const TcpStoreHost&) = delete;
  TcpStoreHost& operator=(const TcpStoreHost&) = delete;

 private:
  TcpStoreHost(int listen_fd, int epoll_fd, int wake_fd);
  void Serve();

  const int listen_fd_;
  const int epoll_fd_;
  const int wake_fd_;  // an eventfd: the destructor's stop signal
  std::thread thread_;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_TCP_STORE_HOST_H_
