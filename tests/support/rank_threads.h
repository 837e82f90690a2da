// Ranks as threads: forms a world/tp grid of process groups in one process, through one shared
// InMemoryStore (no TCP port for the rendezvous), and runs fn(groups) on every rank's thread.
// Header-only so unit tests beside the code can use it.
#ifndef LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_
#define LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "worker/comm/process_groups.h"

namespace latchkey::testing {

inline void RunRankThreads(int world, int tp, const std::function<void(comm::ProcessGroups&)>& fn,
                           comm::Backend backend = comm::Backend::kGloo) {
  auto store = std::make_shared<comm::InMemoryStore>();
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
      ASSERT_TRUE(g.ok()) << g.status();
      fn(*g);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_RANK_THREADS_H_
