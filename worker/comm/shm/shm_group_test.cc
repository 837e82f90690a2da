// The shm transport without libtorch or a rendezvous store, so it builds under ASan+UBSan and
// TSan (scripts/sanitize.sh, scripts/tsan.sh): ranks as threads on one Segment, every
// collective, in float32 and float64, from one element to many slots (a small slot, so one call
// takes several steps and both data buffers alternate), repeated, exact against the rank-order
// sum; an abort from another thread waking a waiter; a timeout; a peer process that dies holding
// its liveness mutex (robust mutex left owner-dead) seen as UNAVAILABLE naming it.
#include "worker/comm/shm/shm_group.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/shm/shm_segment.h"

namespace latchkey::comm {
namespace {

using std::chrono::milliseconds;
constexpr size_t kSlotBytes = 256;  // 32 doubles: a 1000-element call takes 32+ steps

// A one-shot barrier for the ranks' threads.
class Meet {
 public:
  explicit Meet(int n) : left_(n) {}
  void ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

std::string SegmentName() {
  static std::atomic<int> n{0};
  return "latchkey-shm-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// `n` ranks as threads, each with its ShmGroup on one fresh segment in /dev/shm, running `body`.
void RunRanks(int n, const std::function<void(ShmGroup&, int)>& body) {
  const std::string dir = "/dev/shm";
  const std::string name = SegmentName();
  auto created = shm::Segment::Create(dir, name, n, kSlotBytes, 7);
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<std::unique_ptr<shm::Segment>> segs(n);
  segs[0] = *std::move(created);
  for (int r = 1; r < n; ++r) {
    auto opened = shm::Segment::Open(dir, name, n, kSlotBytes, 7);
    ASSERT_TRUE(opened.ok()) << opened.status();
    segs[r] = *std::move(opened);
  }
  unlink((dir + "/" + name).c_str());
  Meet attached(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(segs[r]->Attach(r, r).ok());
      attached.ArriveAndWait();
      ShmGroup group("test", r, n, std::move(segs[r]), /*spin=*/true,
                     std::make_shared<CollectiveStats>());
      body(group, r);
    });
  }
  for (std::thread& t : threads) t.join();
}

template <typename T>
T Value(size_t i, int r, int iter) {
  return static_cast<T>(static_cast<int>((i * 31 + r * 7 + iter) % 97) - 48) / T(8);
}

template <typename T>
constexpr DataType TypeOf() {
  return sizeof(T) == 4 ? DataType::kFloat32 : DataType::kFloat64;
}

template <typename T>
void EveryCollective(int n) {
  for (size_t count : {size_t{1}, size_t{31}, size_t{1000}}) {
    RunRanks(n, [count, n](ShmGroup& g, int r) {
      for (int iter = 0; iter < 5; ++iter) {
        const size_t c = count * n;  // divisible by n for the scatter and gather
        std::vector<T> data(c), want(c);
        for (size_t i = 0; i < c; ++i) {
          data[i] = Value<T>(i, r, iter);
          T sum = 0;
          for (int q = 0; q < n; ++q) sum += Value<T>(i, q, iter);
          want[i] = sum;
        }
        // All-reduce in place: the rank-order sum, bit-exact.
        std::vector<T> ar = data;
        ASSERT_TRUE(g.AllReduceSum(Buffer{ar.data(), c, TypeOf<T>(), Device::Cpu()}).ok());
        EXPECT_EQ(ar, want) << "all_reduce count " << c << " rank " << r;
        // Reduce-scatter: this rank's chunk of the sum.
        std::vector<T> rs(count, T(-1));
        ASSERT_TRUE(g.ReduceScatterSum(Buffer{data.data(), c, TypeOf<T>(), Device::Cpu()},
                                       Buffer{rs.data(), count, TypeOf<T>(), Device::Cpu()})
                        .ok());
        EXPECT_EQ(rs, std::vector<T>(want.begin() + r * count, want.begin() + (r + 1) * count));
        // All-gather: every rank's first `count` elements, in rank order.
        std::vector<T> ag(c, T(-1)), want_ag;
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) want_ag.push_back(Value<T>(i, q, iter));
        }
        ASSERT_TRUE(g.AllGather(Buffer{data.data(), count, TypeOf<T>(), Device::Cpu()},
                                Buffer{ag.data(), c, TypeOf<T>(), Device::Cpu()})
                        .ok());
        EXPECT_EQ(ag, want_ag);
        // Broadcast from the last rank.
        std::vector<T> bc = data, want_bc(c);
        for (size_t i = 0; i < c; ++i) want_bc[i] = Value<T>(i, n - 1, iter);
        ASSERT_TRUE(g.Broadcast(Buffer{bc.data(), c, TypeOf<T>(), Device::Cpu()}, n - 1).ok());
        EXPECT_EQ(bc, want_bc);
        ASSERT_TRUE(g.Barrier().ok());
      }
    });
  }
}

TEST(ShmGroupThreads, EveryCollectiveFloat32) {
  EveryCollective<float>(2);
  EveryCollective<float>(4);
}

TEST(ShmGroupThreads, EveryCollectiveFloat64) {
  EveryCollective<double>(3);
  EveryCollective<double>(4);
}

TEST(ShmGroupThreads, AbortFromAnotherThreadWakesAWaiter) {
  std::atomic<bool> waiting{false};
  RunRanks(2, [&](ShmGroup& g, int r) {
    if (r == 1) {
      // Never arrives; aborts rank 0's wait from this thread once rank 0 is in it.
      while (!waiting.load()) std::this_thread::sleep_for(milliseconds(1));
      std::this_thread::sleep_for(milliseconds(50));
      g.Abort();
      return;
    }
    double x = 1;
    waiting = true;
    const auto t0 = std::chrono::steady_clock::now();
    CollectiveOptions o;
    o.timeout = milliseconds(20000);
    const absl::Status st = g.AllReduceSum(Buffer{&x, 1, DataType::kFloat64, Device::Cpu()}, o);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  });
}

TEST(ShmGroupThreads, TimesOutWhenAPeerNeverArrives) {
  RunRanks(2, [&](ShmGroup& g, int r) {
    if (r == 1) {  // attached and alive, but never arrives
      std::this_thread::sleep_for(milliseconds(1500));
      return;
    }
    double x = 1;
    CollectiveOptions o;
    o.timeout = milliseconds(300);
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status st = g.AllReduceSum(Buffer{&x, 1, DataType::kFloat64, Device::Cpu()}, o);
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(300));
  });
}

// Rank 1 is a child process that attaches and dies (_exit) without leaving: its liveness mutex
// is left owner-dead and rank 0's collective fails UNAVAILABLE naming rank 1, long before the
// timeout.
TEST(ShmGroupProcesses, APeerThatDiesIsUnavailableNamingIt) {
  const std::string dir = "/dev/shm";
  const std::string name = SegmentName();
  auto created = shm::Segment::Create(dir, name, 2, kSlotBytes, 9);
  ASSERT_TRUE(created.ok()) << created.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto opened = shm::Segment::Open(dir, name, 2, kSlotBytes, 9);
    if (!opened.ok() || !(*opened)->Attach(1, 1).ok()) _exit(3);
    _exit(0);  // dies attached: no Detach, the liveness mutex still held
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  unlink((dir + "/" + name).c_str());
  std::unique_ptr<shm::Segment> seg = *std::move(created);
  ASSERT_TRUE(seg->Attach(0, 0).ok());
  ShmGroup g("test", 0, 2, std::move(seg), true, std::make_shared<CollectiveStats>());
  double x = 1;
  CollectiveOptions o;
  o.timeout = milliseconds(20000);
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status st = g.AllReduceSum(Buffer{&x, 1, DataType::kFloat64, Device::Cpu()}, o);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace
}  // namespace latchkey::comm
