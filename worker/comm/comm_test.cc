// Process groups with ranks as threads in one process (gloo's own testing style): the
// in-memory store for the rendezvous, except where the TCP store itself is under test.
#include "worker/comm/comm.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "tests/support/free_port.h"
#include "tests/support/rank_threads.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {
namespace {

void RunRanks(int world, int tp, const std::function<void(ProcessGroups&)>& fn) {
  testing::RunRankThreads(world, tp, fn);
}

TEST(GlooGroups, GridCoordinatesAndCollectives) {
  RunRanks(4, 2, [](ProcessGroups& g) {
    EXPECT_EQ(g.tp_rank, g.rank % 2);
    EXPECT_EQ(g.dp_rank, g.rank / 2);
    EXPECT_EQ(g.tp_group->size(), 2);
    EXPECT_EQ(g.dp_group->size(), 2);

    // all-reduce over TP: ranks {0,1} and {2,3}.
    std::vector<float> x = {static_cast<float>(g.rank), 1.0f};
    ASSERT_TRUE(g.tp_group->AllReduceSum(x.data(), 2, DataType::kFloat32).ok());
    const float expect = g.dp_rank == 0 ? 0 + 1 : 2 + 3;
    EXPECT_EQ(x[0], expect);
    EXPECT_EQ(x[1], 2.0f);

    // all-reduce over DP in fp64: ranks {0,2} and {1,3}.
    double d = g.rank;
    ASSERT_TRUE(g.dp_group->AllReduceSum(&d, 1, DataType::kFloat64).ok());
    EXPECT_EQ(d, g.tp_rank == 0 ? 2.0 : 4.0);

    // all-gather over the world.
    float mine = 10.0f * g.rank;
    std::vector<float> all(4);
    ASSERT_TRUE(g.world->AllGather(&mine, all.data(), 1, DataType::kFloat32).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 10, 20, 30}));

    // reduce-scatter over the world: chunk c of rank r holds r*100 + c.
    std::vector<float> in(8);
    for (int c = 0; c < 4; ++c) {
      in[2 * c] = g.rank * 100.0f + c;
      in[2 * c + 1] = 1.0f;
    }
    std::vector<float> out(2);
    ASSERT_TRUE(g.world->ReduceScatterSum(in.data(), out.data(), 2, DataType::kFloat32).ok());
    EXPECT_EQ(out[0], 600.0f + 4 * g.rank);  // (0+100+200+300) + 4 * chunk index
    EXPECT_EQ(out[1], 4.0f);

    // broadcast from TP rank 1.
    float b = g.tp_rank == 1 ? 42.0f + g.dp_rank : -1.0f;
    ASSERT_TRUE(g.tp_group->Broadcast(&b, 1, DataType::kFloat32, 1).ok());
    EXPECT_EQ(b, 42.0f + g.dp_rank);
    ASSERT_TRUE(g.world->Barrier().ok());

    const auto counts = g.stats->Snapshot();
    EXPECT_EQ(counts.at("all_reduce/tp").calls, 1);
    EXPECT_EQ(counts.at("all_reduce/tp").bytes, 8);
    EXPECT_EQ(counts.at("all_reduce/dp").calls, 1);
    EXPECT_EQ(counts.at("all_gather/world").calls, 1);
    EXPECT_EQ(counts.at("reduce_scatter/world").calls, 1);
    EXPECT_EQ(counts.at("broadcast/tp").calls, 1);
    EXPECT_EQ(counts.at("barrier/world").calls, 1);
  });
}

TEST(GlooGroups, InPlaceAllGatherAndReduceScatter) {
  RunRanks(3, 1, [](ProcessGroups& g) {
    // Reduce-scatter in place: `out` is this rank's chunk of `in`.
    std::vector<double> buf(6);
    for (int c = 0; c < 3; ++c) {
      buf[2 * c] = 10.0 * g.rank + c;
      buf[2 * c + 1] = 1.0;
    }
    ASSERT_TRUE(g.world->ReduceScatterSum(buf.data(), buf.data() + 2 * g.rank, 2,
                                          DataType::kFloat64)
                    .ok());
    EXPECT_EQ(buf[2 * g.rank], 30.0 + 3 * g.rank);  // (0+10+20) + 3 * chunk index
    EXPECT_EQ(buf[2 * g.rank + 1], 3.0);
    // All-gather in place: this rank's chunk already sits at its offset.
    std::vector<float> all(6, -1.0f);
    all[2 * g.rank] = 100.0f + g.rank;
    all[2 * g.rank + 1] = 200.0f + g.rank;
    ASSERT_TRUE(g.world->AllGather(all.data() + 2 * g.rank, all.data(), 2, DataType::kFloat32)
                    .ok());
    EXPECT_EQ(all, (std::vector<float>{100, 200, 101, 201, 102, 202}));
  });
}

TEST(GlooGroups, TaggedCallsCountedSeparately) {
  RunRanks(2, 2, [](ProcessGroups& g) {
    float x = 1.0f;
    CollectiveOptions kv;
    kv.tag = kKvTag;
    ASSERT_TRUE(g.tp_group->AllReduceSum(&x, 1, DataType::kFloat32, kv).ok());
    ASSERT_TRUE(g.tp_group->AllReduceSum(&x, 1, DataType::kFloat32).ok());
    EXPECT_EQ(x, 4.0f);
    EXPECT_EQ(g.stats->TaggedCalls(kKvTag), 1);
    EXPECT_EQ(g.stats->Snapshot().at("all_reduce/tp").calls, 2);
    EXPECT_FALSE(is_parallel(g.dp_group));  // DP = 1
  });
}

TEST(GlooGroups, SingleRankGroupsIssueAndCountNothing) {
  ProcessGroups g = MakeSingleProcessGroups();
  EXPECT_FALSE(is_parallel(g.tp_group));
  EXPECT_FALSE(is_parallel(nullptr));
  float x = 3.0f;
  ASSERT_TRUE(g.tp_group->AllReduceSum(&x, 1, DataType::kFloat32).ok());
  ASSERT_TRUE(g.dp_group->Barrier().ok());
  EXPECT_EQ(x, 3.0f);
  EXPECT_EQ(g.stats->TotalCalls(), 0);
}

TEST(GlooGroups, CollectiveTimesOutInsteadOfHanging) {
  RunRanks(2, 2, [](ProcessGroups& g) {
    if (g.rank == 0) {
      float x = 1.0f;
      CollectiveOptions opts;
      opts.timeout = std::chrono::milliseconds(300);
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = g.tp_group->AllReduceSum(&x, 1, DataType::kFloat32, opts);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
      EXPECT_LT(secs, 10.0);
      EXPECT_NE(st.message().find("all_reduce on group 'tp'"), std::string::npos) << st;
      EXPECT_EQ(g.stats->TotalCalls(), 0);  // failed collectives are not counted
    }
    // Rank 1 never joins the all-reduce; it waits until rank 0 has given up.
    std::this_thread::sleep_for(std::chrono::milliseconds(g.rank == 1 ? 1500 : 0));
  });
}

TEST(GlooGroups, VanishedPeerIsUnavailableBeforeTheTimeout) {
  RunRanks(2, 2, [](ProcessGroups& g) {
    if (g.rank == 1) {
      // Rank 1 goes away (its connections close) while rank 0 waits in an all-reduce.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      g.world.reset();
      g.tp_group.reset();
      return;
    }
    float x = 1.0f;
    CollectiveOptions opts;
    opts.timeout = std::chrono::seconds(20);
    const auto start = std::chrono::steady_clock::now();
    absl::Status st = g.tp_group->AllReduceSum(&x, 1, DataType::kFloat32, opts);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_LT(secs, 10.0);
  });
}

TEST(GlooGroups, FormsGroupsThroughTheTcpStore) {
  const int port = testing::FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([port, r] {
      RendezvousConfig c;
      c.port = port;
      c.rank = r;
      c.world_size = 2;
      c.tp = 2;
      c.rendezvous_timeout = std::chrono::seconds(30);
      auto g = CreateProcessGroups(Backend::kGloo, c);
      ASSERT_TRUE(g.ok()) << g.status();
      float x = static_cast<float>(r + 1);
      ASSERT_TRUE(g->tp_group->AllReduceSum(&x, 1, DataType::kFloat32).ok());
      EXPECT_EQ(x, 3.0f);
      ASSERT_TRUE(g->world->Barrier().ok());  // rank 0 keeps hosting the store until both are done
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Store, InMemoryWaitTimesOutNamingTheMissingKey) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", {1, 2}).ok());
  auto a = store.Get("a", std::chrono::milliseconds(10));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<uint8_t>{1, 2}));
  absl::Status st = store.Wait({"a", "b"}, std::chrono::milliseconds(50));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("b"), std::string::npos) << st;
  PrefixStore prefixed("job", std::make_shared<InMemoryStore>());
  ASSERT_TRUE(prefixed.Set("k", {7}).ok());
  EXPECT_EQ(*prefixed.Get("k", std::chrono::milliseconds(10)), std::vector<uint8_t>{7});
}

TEST(GlooGroups, UnreachableStoreIsUnavailable) {
  RendezvousConfig c;
  c.port = testing::FreePort();  // nobody hosts it
  c.rank = 1;
  c.world_size = 2;
  c.tp = 2;
  c.rendezvous_timeout = std::chrono::seconds(2);
  auto g = CreateProcessGroups(Backend::kGloo, c);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().code() == absl::StatusCode::kUnavailable ||
              g.status().code() == absl::StatusCode::kDeadlineExceeded)
      << g.status();
  EXPECT_NE(g.status().message().find("rank 1"), std::string::npos) << g.status();
}

TEST(GlooGroups, RejectsBadGrid) {
  RendezvousConfig c;
  c.world_size = 3;
  c.tp = 2;
  EXPECT_EQ(CreateProcessGroups(Backend::kGloo, c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latchkey::comm
