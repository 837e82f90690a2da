// The full-mesh address exchange (mesh_exchange.h) with ranks as threads: what every rank
// learns, how many store requests each makes, its errors, and a gloo world connected by it.
#include "worker/comm/mesh_exchange.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/rank_threads.h"
#include "tests/support/tools.h"
#include "worker/comm/comm.h"
#include "worker/comm/gloo/gloo_backend.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {
namespace {

constexpr char kNoGloo[] = "this latchkey-worker is built without libgloo";

// Counts every request each thread (a rank) makes of the store, for keys containing `part`.
class CountingStore final : public Store {
 public:
  explicit CountingStore(std::string part) : part_(std::move(part)) {}
  struct Counts {
    int sets = 0, gets = 0, waits = 0;
  };
  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    if (Counted(key)) ++Mine().sets;
    return base_.Set(key, value);
  }
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override {
    if (Counted(key)) ++Mine().gets;
    return base_.Get(key, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    if (!keys.empty() && Counted(keys[0])) ++Mine().waits;
    return base_.Wait(keys, timeout);
  }
  // Counts of the thread that called Tag(rank).
  std::map<int, Counts> ByRank() {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<int, Counts> out;
    for (auto& [id, c] : counts_) out[rank_of_.at(id)] = c;
    return out;
  }
  std::vector<Counts> AllCounts() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Counts> out;
    for (auto& [id, c] : counts_) out.push_back(c);
    return out;
  }
  void Tag(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    rank_of_[std::this_thread::get_id()] = rank;
  }

 private:
  bool Counted(const std::string& key) const { return key.find(part_) != std::string::npos; }
  Counts& Mine() {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[std::this_thread::get_id()];
  }
  const std::string part_;
  InMemoryStore base_;
  std::mutex mu_;
  std::map<std::thread::id, Counts> counts_;
  std::map<std::thread::id, int> rank_of_;
};

// The full-mesh exchange (mesh_exchange.h): every rank learns, for each peer, the host that
// peer published and the port of the peer's endpoint for it; a non-zero rank makes 3 store
// requests (1 set, 2 gets) whatever the group's size, rank 0 makes 2N.
TEST(MeshExchange, EveryRankLearnsItsPeersEndpointsInConstantRequests) {
  for (int n : {2, 8, 64}) {
    CountingStore store("mesh/");
    // Rank j's host: 4 distinct hosts; its endpoint for peer i: port 1000 + 100 j + i.
    auto host_of = [](int j) { return std::vector<uint8_t>{'h', static_cast<uint8_t>(j % 4)}; };
    std::vector<absl::StatusOr<MeshPeers>> got(n, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        store.Tag(r);
        std::vector<uint16_t> ports(n);
        for (int i = 0; i < n; ++i) ports[i] = static_cast<uint16_t>(1000 + 100 * r + i);
        got[r] = ExchangeMeshAddresses(store, r, n, host_of(r), ports, std::chrono::seconds(20));
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
      EXPECT_EQ(got[r]->hosts.size(), static_cast<size_t>(std::min(n, 4)));
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        EXPECT_EQ(got[r]->hosts[got[r]->host[j]], host_of(j)) << r << " " << j;
        EXPECT_EQ(got[r]->port[j], 1000 + 100 * j + r) << r << " " << j;
      }
    }
    auto counts = store.ByRank();
    ASSERT_EQ(counts.size(), static_cast<size_t>(n));
    for (auto& [rank, c] : counts) {
      if (rank == 0) {
        EXPECT_EQ(c.waits, 1);
        EXPECT_EQ(c.gets, n - 1);
        EXPECT_EQ(c.sets, n);  // the hosts and n - 1 transposed values
      } else {
        EXPECT_EQ(c.sets, 1) << rank;
        EXPECT_EQ(c.gets, 2) << rank;
        EXPECT_EQ(c.waits, 0) << rank;
      }
    }
  }
}

// A record that lies about the group's size is DATA_LOSS naming its rank, not a read past the
// end; a rank that never publishes is a deadline at rank 0 and at the others.
TEST(MeshExchange, MalformedRecordAndMissingRankAreErrors) {
  using std::chrono::milliseconds;
  {
    InMemoryStore store;
    // Rank 1's record for a group of 3 (host "x", 3 ports) in a group of 2.
    const std::vector<uint8_t> liar = {1, 0, 0, 0, 'x', 3, 0, 0, 0, 1, 0, 2, 0, 3, 0};
    ASSERT_TRUE(store.Set("mesh/rec/1", liar).ok());
    auto r0 = ExchangeMeshAddresses(store, 0, 2, {'h'}, {0, 5}, milliseconds(2000));
    EXPECT_EQ(r0.status().code(), absl::StatusCode::kDataLoss) << r0.status();
    EXPECT_NE(r0.status().message().find("rank 1"), std::string::npos) << r0.status();
  }
  {
    InMemoryStore store;
    std::thread other([&] {
      auto r1 = ExchangeMeshAddresses(store, 1, 3, {'h'}, {1, 0, 1}, milliseconds(300));
      EXPECT_EQ(r1.status().code(), absl::StatusCode::kDeadlineExceeded) << r1.status();
    });
    auto r0 = ExchangeMeshAddresses(store, 0, 3, {'h'}, {0, 1, 1}, milliseconds(300));
    other.join();
    EXPECT_EQ(r0.status().code(), absl::StatusCode::kDeadlineExceeded) << r0.status();
    EXPECT_NE(r0.status().message().find("mesh/rec/2"), std::string::npos) << r0.status();
  }
  InMemoryStore store;
  EXPECT_EQ(ExchangeMeshAddresses(store, 2, 2, {}, {0, 0}, milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExchangeMeshAddresses(store, 0, 2, {}, {0}, milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A gloo world of 32 ranks connects its full mesh through that exchange: every pair carries a
// collective (an all-reduce over the world and a broadcast from the last rank), and a non-zero
// rank made the same 3 requests per group at 32 ranks as at 4.
TEST(GlooGroups, WorldOf32ConnectsItsMeshInConstantStoreRequests) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  for (int world : {4, 32}) {
    auto store = std::make_shared<CountingStore>("/mesh/");
    std::vector<float> sums(world, -1.0f), casts(world, -1.0f);  // written by rank r only
    testing::RunRankThreads(
        world, 1,
        [&](ProcessGroups& g) {
          float x = static_cast<float>(g.rank + 1);
          ASSERT_TRUE(g.world->AllReduceSum(HostBuffer(&x, 1)).ok());
          sums[g.rank] = x;
          float b = g.rank == world - 1 ? 7.5f : 0.0f;
          ASSERT_TRUE(g.world->Broadcast(HostBuffer(&b, 1), world - 1).ok());
          casts[g.rank] = b;
        },
        CommBackend::kGloo, store);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(sums[r], world * (world + 1) / 2.0f) << r;
      EXPECT_EQ(casts[r], 7.5f) << r;
    }
    // The threads are not tagged with ranks: the one that waited is rank 0's (once per group
    // it formed: world and dp, tp being 1), every other made 1 set and 2 gets per group.
    int groups = 0, others = 0;
    for (const auto& c : store->AllCounts()) {
      if (c.waits > 0) {
        groups = c.waits;
        EXPECT_EQ(c.gets, groups * (world - 1)) << world;
        EXPECT_EQ(c.sets, groups * world) << world;
      }
    }
    ASSERT_GE(groups, 1) << world;
    for (const auto& c : store->AllCounts()) {
      if (c.waits > 0) continue;
      ++others;
      EXPECT_EQ(c.sets, groups) << world;
      EXPECT_EQ(c.gets, 2 * groups) << world;
    }
    EXPECT_EQ(others, world - 1) << world;
  }
}

}  // namespace
}  // namespace latchkey::comm
