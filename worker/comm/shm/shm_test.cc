// The shm backend: every collective against a rank-order reference and against gloo, ranks as
// threads (in-memory store) and as processes (this binary re-executes itself as a rank, over the
// TCP store); timeouts, abort, a departed peer, a peer killed with kill -9 mid-collective, the
// segment's cleanup in /dev/shm, and the auto/forced backend choice.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/free_port.h"
#include "tests/support/process.h"
#include "tests/support/rank_threads.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tools.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/shm/shm_group.h"

namespace latchkey::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kSlotBytes = 4096;  // small slots, so modest buffers take several chunks

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A prefix no other test (or run) uses, so /dev/shm can be checked for leftovers by name.
std::string UniquePrefix(const std::string& what) {
  static std::atomic<int> n{0};
  return "shmtest_" + what + "_" + std::to_string(getpid()) + "_" + std::to_string(n++);
}

// Files of /dev/shm whose name mentions `prefix`.
std::vector<std::string> SegmentsOf(const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strstr(e->d_name, prefix.c_str()) != nullptr) found.push_back(e->d_name);
    }
    closedir(d);
  }
  return found;
}

using Tweak = std::function<void(RendezvousConfig&)>;

// Ranks as threads through one in-memory store, with a per-rank config tweak.
void RunRanks(int world, int tp, CommBackend backend, const Tweak& tweak,
              const std::function<void(ProcessGroups&)>& fn) {
  auto store = std::make_shared<InMemoryStore>();
  testing::ThreadRendezvous meet(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RendezvousConfig c;
      c.store = store;
      c.rank = r;
      c.world_size = world;
      c.tp = tp;
      c.rendezvous_timeout = std::chrono::seconds(30);
      c.shm_slot_bytes = kSlotBytes;
      if (tweak) tweak(c);
      auto g = CreateProcessGroups(backend, c);
      EXPECT_TRUE(g.ok()) << g.status();
      meet.ArriveAndWait();
      if (g.ok()) fn(*g);
      meet.ArriveAndWait();
    });
  }
  for (auto& t : threads) t.join();
}

bool IsShm(const std::shared_ptr<Group>& g) { return dynamic_cast<ShmGroup*>(g.get()) != nullptr; }

// Rank r's value at element i: not integers, so the sum order shows in the low bits.
template <typename T>
T Value(int r, size_t i) {
  uint64_t z = static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull + i + 1;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<T>(static_cast<double>(z >> 11) / 4503599627370496.0 - 1.0);  // [-1, 1)
}
// The documented order: ((x_0 + x_1) + x_2) + ...
template <typename T>
T RankOrderSum(int n, size_t i) {
  T s = Value<T>(0, i) + Value<T>(1, i);
  for (int r = 2; r < n; ++r) s += Value<T>(r, i);
  return s;
}

template <typename T>
Buffer Buf(std::vector<T>& v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return Buffer{v.data(), v.size(), DataType::kBFloat16, Device::Cpu()};
  } else {
    return HostBuffer(v.data(), v.size());
  }
}

template <typename T>
void CheckCollectives(Group& g, size_t count) {
  const int n = g.size();
  const int r = g.rank();
  SCOPED_TRACE("n=" + std::to_string(n) + " count=" + std::to_string(count));
  // all-reduce: exactly the rank-order sum, hence bit-identical on every rank.
  std::vector<T> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = Value<T>(r, i);
  ASSERT_TRUE(g.AllReduceSum(Buf(x)).ok());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], RankOrderSum<T>(n, i)) << i;
  // reduce-scatter, out of place and in place.
  std::vector<T> in(count * n), out(count);
  for (int c = 0; c < n; ++c) {
    for (size_t i = 0; i < count; ++i) in[c * count + i] = Value<T>(r, c * count + i);
  }
  ASSERT_TRUE(g.ReduceScatterSum(Buf(in), Buf(out)).ok());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], RankOrderSum<T>(n, r * count + i)) << i;
  Buffer whole = Buf(in);
  ASSERT_TRUE(g.ReduceScatterSum(whole, whole.Slice(r * count, count)).ok());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[r * count + i], out[i]) << i;
}

template <typename T>
void CheckMoves(Group& g, size_t count) {
  const int n = g.size();
  const int r = g.rank();
  auto word = [](int rank, size_t i) { return static_cast<T>((rank * 7919 + i) % 65521); };
  // all-gather, out of place and in place.
  std::vector<T> mine(count), all(count * n), expect(count * n);
  for (size_t i = 0; i < count; ++i) mine[i] = word(r, i);
  for (int c = 0; c < n; ++c) {
    for (size_t i = 0; i < count; ++i) expect[c * count + i] = word(c, i);
  }
  ASSERT_TRUE(g.AllGather(Buf(mine), Buf(all)).ok());
  ASSERT_EQ(all, expect);
  std::vector<T> inplace(count * n, T(0));
  std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
  Buffer whole = Buf(inplace);
  ASSERT_TRUE(g.AllGather(whole.Slice(r * count, count), whole).ok());
  ASSERT_EQ(inplace, expect);
  // broadcast from every root.
  for (int root = 0; root < n; ++root) {
    std::vector<T> b(count);
    for (size_t i = 0; i < count; ++i) b[i] = r == root ? word(root + 10, i) : T(0);
    ASSERT_TRUE(g.Broadcast(Buf(b), root).ok());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], word(root + 10, i)) << i;
  }
  ASSERT_TRUE(g.Barrier().ok());
}

// Sizes from one element to several slots (kSlotBytes = 1024 floats), odd ones included.
const std::vector<size_t> kCounts = {1, 3, 255, 1024, 1025, 5000};

TEST(ShmGroups, EveryCollectiveEveryTypeAndSizeAsThreads) {
  for (int n : {2, 4}) {
    RunRanks(n, n, CommBackend::kShm, nullptr, [](ProcessGroups& g) {
      ASSERT_TRUE(IsShm(g.world));
      ASSERT_TRUE(IsShm(g.tp_group));
      for (size_t count : kCounts) {
        CheckCollectives<float>(*g.tp_group, count);
        CheckCollectives<double>(*g.world, count);
        CheckMoves<float>(*g.tp_group, count);
        CheckMoves<double>(*g.world, count);
        CheckMoves<uint16_t>(*g.tp_group, count);
        CheckMoves<uint8_t>(*g.world, count);
      }
    });
  }
}

TEST(ShmGroups, GridGroupsAreShmAndCounted) {
  // auto on one host: every group of a 2x2 grid maps its segment.
  const std::string prefix = UniquePrefix("grid");
  RunRanks(
      4, 2, CommBackend::kAuto, [&](RendezvousConfig& c) { c.prefix = prefix; },
      [&](ProcessGroups& g) {
        EXPECT_TRUE(IsShm(g.world));
        EXPECT_TRUE(IsShm(g.tp_group));
        EXPECT_TRUE(IsShm(g.dp_group));
        // Every rank has mapped every segment: the names are gone already.
        EXPECT_TRUE(SegmentsOf(prefix).empty());
        float x = static_cast<float>(g.rank);
        ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
        EXPECT_EQ(x, g.dp_rank == 0 ? 1.0f : 5.0f);
        double d = g.rank;
        ASSERT_TRUE(g.dp_group->AllReduceSum(HostBuffer(&d, 1)).ok());
        EXPECT_EQ(d, g.tp_rank == 0 ? 2.0 : 4.0);
        ASSERT_TRUE(g.world->Barrier().ok());
        const auto counts = g.stats->Snapshot();
        EXPECT_EQ(counts.at("all_reduce/tp").calls, 1);
        EXPECT_EQ(counts.at("all_reduce/tp").bytes, 4);
        EXPECT_EQ(counts.at("all_reduce/dp").calls, 1);
        EXPECT_EQ(counts.at("barrier/world").calls, 1);
      });
}

// The same inputs through gloo and shm give the same results (integer-valued sums, exact in
// any order).
// Skips a test that compares with gloo, or falls back to it, in a build without libgloo.
#ifdef LATCHKEY_WITH_GLOO
#define LATCHKEY_REQUIRE_GLOO()
#else
#define LATCHKEY_REQUIRE_GLOO() \
  LATCHKEY_REQUIRE_BUILT(false, "this build has no gloo backend (no libgloo)")
#endif

TEST(ShmGroups, AgreesWithGloo) {
  LATCHKEY_REQUIRE_GLOO();
  for (int n : {2, 4}) {
    std::vector<std::vector<float>> results[2];
    for (int b = 0; b < 2; ++b) {
      results[b].resize(n);
      std::mutex mu;
      RunRanks(
          n, 1, b == 0 ? CommBackend::kGloo : CommBackend::kShm, nullptr, [&](ProcessGroups& g) {
            ASSERT_EQ(IsShm(g.world), b == 1);
            const size_t count = 3000;
            std::vector<float> x(count), rs(count / n), ag(count * n), bc(count);
            for (size_t i = 0; i < count; ++i) {
              x[i] = static_cast<float>((g.rank + 1) * (i % 97));
              bc[i] = x[i];
            }
            std::vector<float> in = x;
            ASSERT_TRUE(g.world->AllReduceSum(HostBuffer(x.data(), count)).ok());
            ASSERT_TRUE(g.world
                            ->ReduceScatterSum(HostBuffer(in.data(), count - count % n),
                                               HostBuffer(rs.data(), count / n))
                            .ok());
            ASSERT_TRUE(
                g.world->AllGather(HostBuffer(in.data(), count), HostBuffer(ag.data(), count * n))
                    .ok());
            ASSERT_TRUE(g.world->Broadcast(HostBuffer(bc.data(), count), n - 1).ok());
            std::vector<float> all = x;
            all.insert(all.end(), rs.begin(), rs.end());
            all.insert(all.end(), ag.begin(), ag.end());
            all.insert(all.end(), bc.begin(), bc.end());
            std::lock_guard<std::mutex> lock(mu);
            results[b][g.rank] = all;
          });
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(results[0][r], results[1][r]) << "rank " << r;
  }
}

TEST(ShmGroups, DeterministicRunToRun) {
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    RunRanks(4, 4, CommBackend::kShm, nullptr, [&](ProcessGroups& g) {
      std::vector<float> x(777);
      for (size_t i = 0; i < x.size(); ++i) x[i] = Value<float>(g.rank, i) * 1e3f;
      ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(x.data(), x.size())).ok());
      if (g.rank != 2) return;
      if (run == 0)
        first = x;
      else
        EXPECT_EQ(x, first);
    });
  }
}

TEST(ShmGroups, TimesOutWhenAPeerNeverArrives) {
  RunRanks(2, 2, CommBackend::kShm, nullptr, [](ProcessGroups& g) {
    CollectiveOptions opts;
    opts.timeout = std::chrono::milliseconds(300);
    float x = 1.0f;
    if (g.rank == 0) {
      const auto start = Clock::now();
      absl::Status st = g.tp_group->AllReduceSum(HostBuffer(&x, 1), opts);
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
      EXPECT_GE(Seconds(start), 0.29);
      EXPECT_LT(Seconds(start), 5.0);
      EXPECT_NE(st.message().find("all_reduce on group 'tp'"), std::string::npos) << st;
      EXPECT_EQ(g.stats->TotalCalls(), 0);
      return;
    }
    // Rank 1 comes to a different collective after rank 0 gave up: the group is broken and says
    // by whom, at once. Its own timeout is long (10 s), so "at once" is a bound with room for a
    // loaded machine: under half of it, where waiting for a peer would take all of it.
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    CollectiveOptions late;
    late.timeout = std::chrono::seconds(10);
    const auto start = Clock::now();
    absl::Status st = g.tp_group->Barrier(late);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st;
    EXPECT_LT(Seconds(start), 5.0);
  });
}

TEST(ShmGroups, AbortWakesAWaiter) {
  RunRanks(2, 2, CommBackend::kShm, nullptr, [](ProcessGroups& g) {
    auto* shm = dynamic_cast<ShmGroup*>(g.tp_group.get());
    ASSERT_NE(shm, nullptr);
    CollectiveOptions opts;
    opts.timeout = std::chrono::seconds(30);
    std::vector<float> x(10000, 1.0f);
    if (g.rank == 0) {
      // Aborted from another thread of this rank (recovery's way in) while it waits.
      std::thread aborter([shm] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        shm->Abort();
      });
      const auto start = Clock::now();
      absl::Status st = g.tp_group->AllReduceSum(HostBuffer(x.data(), x.size()), opts);
      aborter.join();
      EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
      EXPECT_NE(st.message().find("aborted by rank 0"), std::string::npos) << st;
      EXPECT_LT(Seconds(start), 3.0);
    } else {
      // The peer's next collective fails at once too.
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      absl::Status st = g.tp_group->AllReduceSum(HostBuffer(x.data(), x.size()), opts);
      EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    }
  });
}

TEST(ShmGroups, DepartedPeerIsUnavailableNamingIt) {
  RunRanks(2, 2, CommBackend::kShm, nullptr, [](ProcessGroups& g) {
    if (g.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      g.world.reset();
      g.tp_group.reset();
      return;
    }
    float x = 1.0f;
    CollectiveOptions opts;
    opts.timeout = std::chrono::seconds(30);
    const auto start = Clock::now();
    absl::Status st = g.tp_group->AllReduceSum(HostBuffer(&x, 1), opts);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st;
    EXPECT_LT(Seconds(start), 3.0);
  });
}

// A rank whose shm directory is not rank 0's cannot open the segment (as containers with
// separate /dev/shm mounts): auto falls back to gloo for that group, shm forced fails naming
// latchkey.backend, on every rank alike.
TEST(ShmGroups, AutoFallsBackToGlooWhenARankCannotMap) {
  LATCHKEY_REQUIRE_GLOO();
  testing::ScopedTempDir other("shm-dir");
  const std::string prefix = UniquePrefix("fallback");
  // 2 x 2: rank 3 sees another directory, so none of its groups can share a segment: the
  // world, TP group {2, 3} and DP group {1, 3} go through gloo; TP {0, 1} and DP {0, 2} map.
  const Tweak tweak = [&](RendezvousConfig& c) {
    c.prefix = prefix;
    if (c.rank == 3) c.shm_dir = other.path();
  };
  RunRanks(4, 2, CommBackend::kAuto, tweak, [&](ProcessGroups& g) {
    EXPECT_FALSE(IsShm(g.world));
    EXPECT_EQ(IsShm(g.tp_group), g.dp_rank == 0);
    EXPECT_EQ(IsShm(g.dp_group), g.tp_rank == 0);
    float x = 1.0f;
    ASSERT_TRUE(g.world->AllReduceSum(HostBuffer(&x, 1)).ok());
    EXPECT_EQ(x, 4.0f);
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
    EXPECT_EQ(x, 8.0f);
    ASSERT_TRUE(g.dp_group->AllReduceSum(HostBuffer(&x, 1)).ok());
    EXPECT_EQ(x, 16.0f);
  });
  EXPECT_TRUE(SegmentsOf(prefix).empty());

  // Forced: both ranks of a 2-rank world fail alike, naming the key and the rank that could not.
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RendezvousConfig c;
      c.store = store;
      c.rank = r;
      c.world_size = 2;
      c.tp = 2;
      c.prefix = prefix + "_forced";
      c.rendezvous_timeout = std::chrono::seconds(30);
      if (r == 1) c.shm_dir = other.path();
      auto g = CreateProcessGroups(CommBackend::kShm, c);
      ASSERT_FALSE(g.ok());
      EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
      EXPECT_EQ(g.status().message().rfind("latchkey.backend: \"shm\"", 0), 0u) << g.status();
      EXPECT_NE(g.status().message().find("rank 1:"), std::string::npos) << g.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(SegmentsOf(prefix).empty());
}

TEST(ShmGroups, RefusesDeviceBuffers) {
  RunRanks(2, 2, CommBackend::kShm, nullptr, [](ProcessGroups& g) {
    std::vector<float> x(4, 1.0f);
    Buffer cuda = HostBuffer(x.data(), 4);
    cuda.device = Device::Cuda(0);
    absl::Status st = g.tp_group->AllReduceSum(cuda);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("shm backend takes cpu buffers only"), std::string::npos) << st;
    ASSERT_TRUE(g.tp_group->AllReduceSum(HostBuffer(x.data(), 4)).ok());
    EXPECT_EQ(x, std::vector<float>(4, 2.0f));
  });
}

// ---- ranks as processes --------------------------------------------------------------------

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// A child rank (LATCHKEY_SHM_TEST_CHILD="<rank> <world> <port> <prefix> <mode>"): forms the
// groups over the TCP store with shm forced, then
//   check: every collective and size on the world group, prints "ok";
//   loop:  all-reduces 1 MiB (several slots) until one fails, printing "looping" after the
//          first and, on the failure, "failed <code> <seconds> <message>".
int ChildMain(const char* spec) {
  int rank = 0, world = 0, port = 0;
  char prefix[256] = {0}, mode[32] = {0};
  if (std::sscanf(spec, "%d %d %d %255s %31s", &rank, &world, &port, prefix, mode) != 5) return 2;
  RendezvousConfig c;
  c.rank = rank;
  c.world_size = world;
  c.tp = world;
  c.port = port;
  c.prefix = prefix;
  c.rendezvous_timeout = std::chrono::seconds(60);
  c.shm_slot_bytes = 64 * 1024;
  auto g = CreateProcessGroups(CommBackend::kShm, c);
  if (!g.ok()) {
    std::cout << "groups: " << g.status() << std::endl;
    return 3;
  }
  if (std::string(mode) == "check") {
    for (size_t count : {size_t{1}, size_t{1000}, size_t{40000}}) {
      CheckCollectives<float>(*g->world, count);
      CheckCollectives<double>(*g->world, count);
      CheckMoves<uint16_t>(*g->world, count);
      CheckMoves<float>(*g->world, count);
    }
    if (::testing::Test::HasFailure()) return 4;
    std::cout << "ok" << std::endl;
    return 0;
  }
  std::vector<float> x(1 << 18, 1.0f);
  CollectiveOptions opts;
  opts.timeout = std::chrono::seconds(30);
  for (int i = 0;; ++i) {
    const auto start = Clock::now();
    absl::Status st = g->world->AllReduceSum(HostBuffer(x.data(), x.size()), opts);
    if (!st.ok()) {
      std::cout << "failed " << absl::StatusCodeToString(st.code()) << " " << Seconds(start) << " "
                << st.message() << std::endl;
      return 5;
    }
    if (i == 0) std::cout << "looping" << std::endl;
    std::fill(x.begin(), x.end(), 1.0f);
  }
}

struct Ranks {
  std::vector<int> pids;
  std::vector<std::string> logs;
};

Ranks StartRanks(int world, const std::string& prefix, const std::string& mode,
                 const testing::ScopedTempDir& dir) {
  Ranks ranks;
  const int port = testing::FreePort();
  for (int r = 0; r < world; ++r) {
    const std::string log = dir / ("rank" + std::to_string(r) + ".log");
    const std::string spec = std::to_string(r) + " " + std::to_string(world) + " " +
                             std::to_string(port) + " " + prefix + " " + mode;
    ranks.pids.push_back(
        testing::StartProcess({SelfPath()}, {"LATCHKEY_SHM_TEST_CHILD=" + spec}, log));
    ranks.logs.push_back(log);
  }
  return ranks;
}

TEST(ShmProcesses, EveryCollectiveAcrossProcesses) {
  for (int world : {2, 4}) {
    testing::ScopedTempDir dir("shm-procs");
    const std::string prefix = UniquePrefix("procs");
    Ranks ranks = StartRanks(world, prefix, "check", dir);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(testing::WaitProcess(ranks.pids[r], std::chrono::seconds(120)), 0)
          << testing::ReadText(ranks.logs[r]);
      EXPECT_NE(testing::ReadText(ranks.logs[r]).find("ok"), std::string::npos);
    }
    EXPECT_TRUE(SegmentsOf(prefix).empty());
  }
}

TEST(ShmProcesses, PeerKilledMidCollectiveIsUnavailableAndLeavesNoSegment) {
  testing::ScopedTempDir dir("shm-kill");
  const std::string prefix = UniquePrefix("kill");
  const int world = 3;
  Ranks ranks = StartRanks(world, prefix, "loop", dir);
  for (int r = 0; r < world; ++r) {
    const std::string text = testing::WaitForFile(
        ranks.logs[r], [](const std::string& t) { return t.find("looping") != std::string::npos; },
        std::chrono::seconds(60));
    ASSERT_NE(text.find("looping"), std::string::npos) << text;
  }
  // Every rank is inside an all-reduce loop; rank 1 dies without a chance to clean up.
  ASSERT_EQ(kill(ranks.pids[1], SIGKILL), 0);
  const auto killed = Clock::now();
  for (int r : {0, 2}) {
    EXPECT_EQ(testing::WaitProcess(ranks.pids[r], std::chrono::seconds(60)), 5);
    const std::string text = testing::ReadText(ranks.logs[r]);
    EXPECT_NE(text.find("failed UNAVAILABLE"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1 (job rank 1, pid " + std::to_string(ranks.pids[1]) + ")"),
              std::string::npos)
        << text;
  }
  // Well within the collective's 30 s timeout.
  EXPECT_LT(Seconds(killed), 5.0);
  testing::WaitProcess(ranks.pids[1], std::chrono::seconds(10));
  EXPECT_TRUE(SegmentsOf(prefix).empty());
}

// A rank stopped by a signal while it waits in the rendezvous (rank 0 has created the segment,
// its peer never comes) unlinks the name on its way out, and still ends by that signal.
TEST(ShmProcesses, RankStoppedBySignalDuringRendezvousLeavesNoSegment) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    testing::ScopedTempDir dir("shm-signal");
    const std::string prefix = UniquePrefix("signal");
    const std::string log = dir / "rank0.log";
    const int pid =
        testing::StartProcess({SelfPath()},
                              {"LATCHKEY_SHM_TEST_CHILD=0 2 " +
                               std::to_string(testing::FreePort()) + " " + prefix + " check"},
                              log);
    ASSERT_GT(pid, 0);
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (SegmentsOf(prefix).empty() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_FALSE(SegmentsOf(prefix).empty()) << testing::ReadText(log);
    ASSERT_EQ(kill(pid, sig), 0);
    EXPECT_EQ(testing::WaitProcess(pid, std::chrono::seconds(10)), 128 + sig)
        << strsignal(sig) << "\n"
        << testing::ReadText(log);
    EXPECT_TRUE(SegmentsOf(prefix).empty()) << strsignal(sig);
  }
}

}  // namespace
}  // namespace latchkey::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* child = std::getenv("LATCHKEY_SHM_TEST_CHILD")) {
    return latchkey::comm::ChildMain(child);
  }
  return RUN_ALL_TESTS();
}
