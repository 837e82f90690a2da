// Process groups with ranks as threads in one process (gloo's own testing style): the
// in-memory store for the rendezvous, except where the TCP store itself is under test.
#include "worker/comm/comm.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "tests/support/free_port.h"
#include "tests/support/rank_threads.h"
#include "tests/support/tools.h"
#include "worker/comm/gloo/gloo_backend.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/shm/shm_group.h"

namespace latchkey::comm {
namespace {

constexpr char kNoGloo[] = "this latchkey-worker is built without libgloo";

// These are gloo's tests (the shm backend's are in shm/shm_test.cc): named explicitly, since
// auto picks shm for ranks on one host.
void RunRanks(int world, int tp, const std::function<void(ProcessGroups&)>& fn) {
  testing::RunRankThreads(world, tp, fn, CommBackend::kGloo);
}

TEST(GlooGroups, GridCoordinatesAndCollectives) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(4, 2, [](ProcessGroups& g) {
    EXPECT_EQ(g.tp_rank, g.rank % 2);
    EXPECT_EQ(g.dp_rank, g.rank / 2);
    EXPECT_EQ(g.tp_group->size(), 2);
    EXPECT_EQ(g.dp_group->size(), 2);

    // all-reduce over TP: ranks {0,1} and {2,3}.
    std::vector<float> x = {static_cast<float>(g.rank), 1.0f};
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(x.data(), 2)).ok());
    const float expect = g.dp_rank == 0 ? 0 + 1 : 2 + 3;
    EXPECT_EQ(x[0], expect);
    EXPECT_EQ(x[1], 2.0f);

    // all-reduce over DP in fp64: ranks {0,2} and {1,3}.
    double d = g.rank;
    ASSERT_TRUE(g.dp_group->AllReduceSum(HostBuffer(&d, 1)).ok());
    EXPECT_EQ(d, g.tp_rank == 0 ? 2.0 : 4.0);

    // all-gather over the world.
    float mine = 10.0f * g.rank;
    std::vector<float> all(4);
    ASSERT_TRUE(g.world->AllGather(HostBuffer(&mine, 1), HostBuffer(all.data(), 4)).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 10, 20, 30}));

    // reduce-scatter over the world: chunk c of rank r holds r*100 + c.
    std::vector<float> in(8);
    for (int c = 0; c < 4; ++c) {
      in[2 * c] = g.rank * 100.0f + c;
      in[2 * c + 1] = 1.0f;
    }
    std::vector<float> out(2);
    ASSERT_TRUE(
        g.world->ReduceScatterSum(HostBuffer(in.data(), 8), HostBuffer(out.data(), 2)).ok());
    EXPECT_EQ(out[0], 600.0f + 4 * g.rank);  // (0+100+200+300) + 4 * chunk index
    EXPECT_EQ(out[1], 4.0f);

    // broadcast from TP rank 1.
    float b = g.tp_rank == 1 ? 42.0f + g.dp_rank : -1.0f;
    ASSERT_TRUE(g.tp_group->Broadcast(HostBuffer(&b, 1), 1).ok());
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
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(3, 1, [](ProcessGroups& g) {
    // Reduce-scatter in place: `out` is this rank's chunk of `in`.
    std::vector<double> buf(6);
    for (int c = 0; c < 3; ++c) {
      buf[2 * c] = 10.0 * g.rank + c;
      buf[2 * c + 1] = 1.0;
    }
    ASSERT_TRUE(
        g.world->ReduceScatterSum(HostBuffer(buf.data(), 6), HostBuffer(buf.data() + 2 * g.rank, 2))
            .ok());
    EXPECT_EQ(buf[2 * g.rank], 30.0 + 3 * g.rank);  // (0+10+20) + 3 * chunk index
    EXPECT_EQ(buf[2 * g.rank + 1], 3.0);
    // All-gather in place: this rank's chunk already sits at its offset.
    std::vector<float> all(6, -1.0f);
    all[2 * g.rank] = 100.0f + g.rank;
    all[2 * g.rank + 1] = 200.0f + g.rank;
    ASSERT_TRUE(
        g.world->AllGather(HostBuffer(all.data() + 2 * g.rank, 2), HostBuffer(all.data(), 6)).ok());
    EXPECT_EQ(all, (std::vector<float>{100, 200, 101, 201, 102, 202}));
  });
}

TEST(GlooGroups, TaggedCallsCountedSeparately) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(2, 2, [](ProcessGroups& g) {
    float x = 1.0f;
    CollectiveOptions kv;
    kv.tag = kKvTag;
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(&x, 1), kv).ok());
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
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
  ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
  ASSERT_TRUE(g.dp_group->Barrier().ok());
  EXPECT_EQ(x, 3.0f);
  EXPECT_EQ(g.stats->TotalCalls(), 0);
}

TEST(GlooGroups, CollectiveTimesOutInsteadOfHanging) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(2, 2, [](ProcessGroups& g) {
    if (g.rank == 0) {
      float x = 1.0f;
      CollectiveOptions opts;
      opts.timeout = std::chrono::milliseconds(300);
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = g.tp_group->AllReduceSum(HostBuffer(&x, 1), opts);
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
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
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
    absl::Status st = g.tp_group->AllReduceSum(HostBuffer(&x, 1), opts);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_LT(secs, 10.0);
  });
}

TEST(GlooGroups, FormsGroupsThroughTheTcpStore) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
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
      auto g = CreateProcessGroups(CommBackend::kGloo, c);
      ASSERT_TRUE(g.ok()) << g.status();
      float x = static_cast<float>(r + 1);
      ASSERT_TRUE(g->tp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
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

// The TCP store's Get blocks until another client sets the key, and a missing key is a deadline
// after the timeout asked for: the store's own (c10d's get waits by itself) or another.
TEST(Store, TcpGetWaitsForALaterSetAndTimesOutOnAMissingKey) {
  using std::chrono::milliseconds;
  const int port = testing::FreePort();
  const milliseconds timeout(1500);
  auto host = ConnectTcpStore("127.0.0.1", port, true, 2, timeout);
  ASSERT_TRUE(host.ok()) << host.status();
  auto other = ConnectTcpStore("127.0.0.1", port, false, 2, timeout);
  ASSERT_TRUE(other.ok()) << other.status();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_TRUE((*other)->Set("late", {4, 2}).ok());
  });
  auto late = (*host)->Get("late", timeout);
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, (std::vector<uint8_t>{4, 2}));
  auto sooner = (*host)->Get("late", milliseconds(300));
  ASSERT_TRUE(sooner.ok()) << sooner.status();
  EXPECT_EQ(*sooner, (std::vector<uint8_t>{4, 2}));
  for (milliseconds t : {timeout, milliseconds(300)}) {
    const auto start = std::chrono::steady_clock::now();
    auto missing = (*other)->Get("never", t);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
    EXPECT_GE(took, t * 9 / 10) << t.count();
    EXPECT_LT(took, t + std::chrono::seconds(5)) << t.count();
  }
}

// A second host on a port the first holds is UNAVAILABLE naming the port; the first serves on.
TEST(Store, TcpHostOnATakenPortIsUnavailable) {
  using std::chrono::milliseconds;
  const int port = testing::FreePort();
  auto first = ConnectTcpStore("127.0.0.1", port, true, 1, milliseconds(2000));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ConnectTcpStore("127.0.0.1", port, true, 1, milliseconds(2000));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(std::to_string(port)), std::string::npos)
      << second.status();
  ASSERT_TRUE((*first)->Set("k", {9}).ok());
  EXPECT_EQ(*(*first)->Get("k", milliseconds(1000)), std::vector<uint8_t>{9});
}

TEST(GlooGroups, UnreachableStoreIsUnavailable) {
  RendezvousConfig c;
  c.port = testing::FreePort();  // nobody hosts it
  c.rank = 1;
  c.world_size = 2;
  c.tp = 2;
  c.rendezvous_timeout = std::chrono::seconds(2);
  auto g = CreateProcessGroups(CommBackend::kGloo, c);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().code() == absl::StatusCode::kUnavailable ||
              g.status().code() == absl::StatusCode::kDeadlineExceeded)
      << g.status();
  EXPECT_NE(g.status().message().find("rank 1"), std::string::npos) << g.status();
}

TEST(Backends, NamesRoundTrip) {
  for (CommBackend b :
       {CommBackend::kAuto, CommBackend::kGloo, CommBackend::kShm, CommBackend::kNccl}) {
    EXPECT_EQ(ParseCommBackend(CommBackendName(b)), b) << CommBackendName(b);
  }
  EXPECT_EQ(ParseCommBackend("mpi"), std::nullopt);
}

TEST(Backends, AutoOnOneHostIsShmAndGivesTheSameSums) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  // The default the runners use: ranks of one host share segments; results match gloo's.
  for (CommBackend b : {CommBackend::kAuto, CommBackend::kGloo}) {
    testing::RunRankThreads(
        4, 2,
        [b](ProcessGroups& g) {
          const bool gloo = dynamic_cast<const ShmGroup*>(g.tp_group.get()) == nullptr;
          EXPECT_EQ(gloo, b == CommBackend::kGloo);
          std::vector<float> x = {static_cast<float>(g.rank), 1.0f};
          ASSERT_TRUE(g.world->AllReduceSum(HostBuffer(x.data(), 2)).ok());
          EXPECT_EQ(x, (std::vector<float>{6.0f, 4.0f}));
          ASSERT_TRUE(g.dp_group->Barrier().ok());
        },
        b);
  }
}

TEST(GlooGroups, RejectsBadGrid) {
  RendezvousConfig c;
  c.world_size = 3;
  c.tp = 2;
  EXPECT_EQ(CreateProcessGroups(CommBackend::kGloo, c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A buffer tagged with a CUDA device; comm never dereferences it (the memory is host memory so
// that a wrong dereference would not crash the test, only fail it).
Buffer FakeCudaBuffer(float* data, size_t count) {
  Buffer b = HostBuffer(data, count);
  b.device = Device::Cuda(0);
  return b;
}

TEST(Buffers, GlooRefusesDeviceBuffersBeforeIssuing) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(2, 2, [](ProcessGroups& g) {
    std::vector<float> x(4, 1.0f);
    absl::Status st = g.tp_group->AllReduceSum(FakeCudaBuffer(x.data(), 2));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st;
    EXPECT_NE(st.message().find("gloo"), std::string::npos) << st;
    EXPECT_NE(st.message().find("all_reduce on group 'tp'"), std::string::npos) << st;
    st = g.tp_group->AllGather(FakeCudaBuffer(x.data(), 2), FakeCudaBuffer(x.data(), 4));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    st = g.tp_group->ReduceScatterSum(FakeCudaBuffer(x.data(), 4), FakeCudaBuffer(x.data(), 2));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    st = g.tp_group->Broadcast(FakeCudaBuffer(x.data(), 4), 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(x, std::vector<float>(4, 1.0f));
    EXPECT_EQ(g.stats->TotalCalls(), 0);  // refused, not issued, not counted
    // The group still works afterwards.
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(x.data(), 4)).ok());
    EXPECT_EQ(x, std::vector<float>(4, 2.0f));
  });
}

TEST(Buffers, BuffersThatDoNotFitAreInvalid) {
  ProcessGroups g = MakeSingleProcessGroups();
  std::vector<float> f(4, 1.0f);
  std::vector<double> d(4, 1.0);
  // all-gather: out must hold size() * in.count elements of the same type, on the same device.
  EXPECT_EQ(g.tp_group->AllGather(HostBuffer(f.data(), 2), HostBuffer(f.data(), 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.tp_group->AllGather(HostBuffer(f.data(), 2), HostBuffer(d.data(), 2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.tp_group->AllGather(HostBuffer(f.data(), 2), FakeCudaBuffer(f.data() + 2, 2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.tp_group->ReduceScatterSum(HostBuffer(f.data(), 4), HostBuffer(f.data(), 2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.tp_group->AllReduceSum(Buffer{nullptr, 3, DataType::kFloat32, Device::Cpu()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f, std::vector<float>(4, 1.0f));
}

TEST(Buffers, SingleRankCopiesOnTheBuffersDevice) {
  ProcessGroups g = MakeSingleProcessGroups();
  std::vector<float> a = {1, 2}, b = {0, 0};
  ASSERT_TRUE(g.dp_group->AllGather(HostBuffer(a.data(), 2), HostBuffer(b.data(), 2)).ok());
  EXPECT_EQ(b, a);
  std::vector<float> c = {0, 0};
  ASSERT_TRUE(g.dp_group->ReduceScatterSum(HostBuffer(a.data(), 2), HostBuffer(c.data(), 2)).ok());
  EXPECT_EQ(c, a);
  // Device memory: in place is a no-op; a copy needs the device's backend (comm has none).
  ASSERT_TRUE(g.dp_group->AllGather(FakeCudaBuffer(a.data(), 2), FakeCudaBuffer(a.data(), 2)).ok());
  absl::Status st = g.dp_group->AllGather(FakeCudaBuffer(a.data(), 2), FakeCudaBuffer(b.data(), 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st;
  // A single rank's all-reduce is a no-op on any device.
  EXPECT_TRUE(g.dp_group->AllReduceSum(FakeCudaBuffer(a.data(), 2)).ok());
  EXPECT_EQ(g.stats->TotalCalls(), 0);
}

TEST(GlooGroups, BytesAreGatheredAndBroadcastButNeverSummed) {
  LATCHKEY_REQUIRE_BUILT(GlooBuiltIn(), kNoGloo);
  RunRanks(2, 1, [](ProcessGroups& g) {
    // A 32-byte digest per rank, gathered byte for byte.
    std::vector<uint8_t> mine(32), all(64);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(g.rank * 100 + i);
    ASSERT_TRUE(g.world->AllGather(HostBuffer(mine.data(), 32), HostBuffer(all.data(), 64)).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(all[i], static_cast<uint8_t>((i / 32) * 100 + i % 32)) << i;
    }
    std::vector<uint8_t> b(5, g.rank == 1 ? 0xab : 0);
    ASSERT_TRUE(g.world->Broadcast(HostBuffer(b.data(), 5), 1).ok());
    EXPECT_EQ(b, std::vector<uint8_t>(5, 0xab));
    absl::Status st = g.world->AllReduceSum(HostBuffer(b.data(), 5));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("uint8"), std::string::npos) << st;
    st = g.world->ReduceScatterSum(HostBuffer(all.data(), 64), HostBuffer(mine.data(), 32));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(g.stats->TotalCalls(), 2);  // the refused sums are not counted
  });
}

TEST(SingleRankGroups, AreFormedForTheConfigsDevice) {
  RendezvousConfig c;
  c.device = Device::Cuda(1);
  auto g = CreateProcessGroups(CommBackend::kNccl, c);  // a world of one: no backend needed
  ASSERT_TRUE(g.ok()) << g.status();
  for (const auto& grp : {g->world, g->tp_group, g->dp_group}) {
    EXPECT_EQ(grp->size(), 1);
    EXPECT_EQ(grp->device(), Device::Cuda(1)) << grp->name();
  }
  EXPECT_EQ(MakeSingleProcessGroups().world->device(), Device::Cpu());
  // Another device's memory is not copied (the copy would need that device's runtime).
  std::vector<float> a = {1, 2}, b = {0, 0};
  absl::Status st = g->dp_group->AllGather(HostBuffer(a.data(), 2), HostBuffer(b.data(), 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("formed for cuda:1"), std::string::npos) << st;
  EXPECT_EQ(b, (std::vector<float>{0, 0}));
}

TEST(ProcessGroupsConfig, ABackendThatCannotTakeTheDeviceIsRefusedBeforeTheRendezvous) {
  RendezvousConfig c;
  c.world_size = 2;
  c.rendezvous_timeout = std::chrono::milliseconds(100);
  c.device = Device::Cuda(0);
  absl::Status st = CreateProcessGroups(CommBackend::kGloo, c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("latchkey.backend: \"gloo\""), std::string::npos) << st;
  c.device = Device::Cpu();
  st = CreateProcessGroups(CommBackend::kNccl, c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("latchkey.backend: \"nccl\""), std::string::npos) << st;
}

TEST(Buffers, SliceAndDeviceNames) {
  std::vector<double> d(6);
  Buffer b = HostBuffer(d.data(), 6).Slice(2, 3);
  EXPECT_EQ(b.data, d.data() + 2);
  EXPECT_EQ(b.count, 3u);
  EXPECT_EQ(b.bytes(), 24u);
  EXPECT_EQ(b.type, DataType::kFloat64);
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_EQ(Device::Cuda(1).ToString(), "cuda:1");
  EXPECT_NE(Device::Cuda(0), Device::Cuda(1));
  EXPECT_EQ(DataTypeSize(DataType::kUInt8), 1u);
  EXPECT_STREQ(DataTypeName(DataType::kUInt8), "uint8");
}

}  // namespace
}  // namespace latchkey::comm
