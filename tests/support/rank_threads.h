// Ranks as threads: forms a world/tp grid of process groups in one process, through one shared
// InMemoryStore (no TCP port for the rendezvous), and runs fn(groups) on every rank's thread.
// Header-only so unit tests beside the code can use it.
#ifndef LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_
#define LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_

#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/comm/process_groups.h"

namespace latchkey::testing {

// A reusable meeting point for `n` threads (std::barrier is C++20).
class ThreadRendezvous {
 public:
  explicit ThreadRendezvous(int n) : n_(n) {}
  void ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int round = round_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return round_ != round; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int round_ = 0;
};

// Every rank's fn starts only once all ranks have formed their groups, and no rank tears its
// groups down before every fn has returned: a rank finishing early must not close connections
// a slower peer is still completing. `store` null: a fresh InMemoryStore.
inline void RunRankThreads(int world, int tp, const std::function<void(comm::ProcessGroups&)>& fn,
                           CommBackend backend = CommBackend::kAuto,
                           std::shared_ptr<comm::Store> store = nullptr) {
  if (store == nullptr) store = std::make_shared<comm::InMemoryStore>();
  ThreadRendezvous meet(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::RendezvousConfig c;
      c.store = store;
      c.rank = r;
      c.world_size = world;
      c.tp = tp;
      c.rendezvous_timeout = std::chrono::seconds(30);
      auto g = comm::CreateProcessGroups(backend, c);
      EXPECT_TRUE(g.ok()) << g.status();
      meet.ArriveAndWait();
      if (g.ok()) fn(*g);
      meet.ArriveAndWait();
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_
