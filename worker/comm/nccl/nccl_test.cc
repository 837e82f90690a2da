// The NCCL backend without a GPU where it can be: the unique id's rendezvous through the
// in-memory and the TCP store (identical bytes on every rank, a differing digest named), the
// process groups refused with the missing CUDA device named, NCCL errors as Status. With a GPU:
// the one-rank self-test (skipped, with the reason, on a machine without one).
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/support/free_port.h"
#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_group.h"
#include "worker/comm/nccl/nccl_self_test.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/store.h"
#include "worker/device/cuda_runtime.h"

namespace latchkey::comm {
namespace {

using std::chrono::milliseconds;

bool HaveGpu() { return CudaDeviceCount().ok(); }

TEST(NcclUniqueId, EveryRankGetsTheSame128BytesThroughTheStore) {
  constexpr int kRanks = 4;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<absl::StatusOr<std::string>> got(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      PrefixStore prefixed("job/a1/world", store);
      got[r] = ExchangeNcclUniqueId(prefixed, r, kRanks, milliseconds(10000));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status();
    EXPECT_EQ(got[r]->size(), kNcclUniqueIdBytes);
    EXPECT_EQ(*got[r], *got[0]) << "rank " << r;
  }
  // The id is what rank 0 published, byte for byte, under the group's prefix.
  auto published = store->Get("job/a1/world/nccl/id", milliseconds(10));
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(std::string(published->begin(), published->end()), *got[0]);
  EXPECT_NE(*got[0], std::string(kNcclUniqueIdBytes, '\0'));
}

TEST(NcclUniqueId, ADifferingDigestIsNamed) {
  InMemoryStore store;
  // Rank 1 claims to have received other bytes.
  const std::string bogus(64, 'f');
  ASSERT_TRUE(store.Set("nccl/digest/1", std::vector<uint8_t>(bogus.begin(), bogus.end())).ok());
  auto got = ExchangeNcclUniqueId(store, 0, 2, milliseconds(2000));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("rank 1 got bytes with SHA-256 " + bogus),
            std::string::npos)
      << got.status();
}

// Rank 0's verdict reaches the others: with rank 2's digest differing, ranks 0 and 1 both fail
// naming rank 2 (rank 2 itself never runs; its bogus digest is planted).
TEST(NcclUniqueId, RankZerosVerdictNamesTheDifferingRankOnEveryRank) {
  InMemoryStore store;
  const std::string bogus(64, 'e');
  ASSERT_TRUE(store.Set("nccl/digest/2", std::vector<uint8_t>(bogus.begin(), bogus.end())).ok());
  std::vector<absl::StatusOr<std::string>> got(2, absl::UnknownError("not run"));
  std::thread one([&] { got[1] = ExchangeNcclUniqueId(store, 1, 3, milliseconds(5000)); });
  got[0] = ExchangeNcclUniqueId(store, 0, 3, milliseconds(5000));
  one.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    EXPECT_EQ(got[r].status().code(), absl::StatusCode::kInternal) << r;
    EXPECT_NE(got[r].status().message().find("rank 2 got bytes with SHA-256 " + bogus),
              std::string::npos)
        << r << ": " << got[r].status();
  }
}

// Counts the reads that reach the store beneath.
class CountingStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    return base_.Set(key, value);
  }
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override {
    gets_++;
    return base_.Get(key, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    waited_keys_ += static_cast<int64_t>(keys.size());
    return base_.Wait(keys, timeout);
  }
  int64_t gets() const { return gets_; }
  int64_t waited_keys() const { return waited_keys_; }

 private:
  InMemoryStore base_;
  std::atomic<int64_t> gets_{0};
  std::atomic<int64_t> waited_keys_{0};
};

// The exchange's reads grow linearly with the ranks (one store serves them all: every rank
// reading every rank's digest was 64 * 64 reads here, 4096 * 4096 at 4096 ranks).
TEST(NcclUniqueId, StoreReadsAreLinearInTheRanks) {
  constexpr int kRanks = 64;
  CountingStore store;
  std::vector<absl::StatusOr<std::string>> got(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back(
        [&, r] { got[r] = ExchangeNcclUniqueId(store, r, kRanks, milliseconds(10000)); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], *got[0]) << r;
  }
  EXPECT_LE(store.gets(), 3 * kRanks);
  EXPECT_LE(store.waited_keys(), 2 * kRanks);
}

TEST(NcclUniqueId, AMissingRankZeroIsADeadline) {
  InMemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  auto got = ExchangeNcclUniqueId(store, 1, 2, milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Two ranks as threads form kNccl groups over `store` (null: the TCP store at `port`).
std::vector<absl::Status> FormNcclGroups(int world, int tp, std::shared_ptr<Store> store,
                                         int port) {
  std::vector<absl::Status> out(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RendezvousConfig c;
      c.rank = r;
      c.world_size = world;
      c.tp = tp;
      c.store = store;
      c.port = port;
      c.prefix = "job7/a1";
      c.device = Device::Cuda(r);
      c.rendezvous_timeout = milliseconds(20000);
      out[r] = CreateProcessGroups(CommBackend::kNccl, c).status();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// The digest a rank reports for `group` ("world", "tp", "dp"): 16 hex digits, "" if none.
std::string Digest(const absl::Status& st, const std::string& group) {
  const std::string m(st.message());
  const std::string key = group + " sha256 ";
  const size_t b = m.find(key, m.find("agreed by every rank ("));
  return b == std::string::npos ? "" : m.substr(b + key.size(), 16);
}

// Every rank refused for the missing device, after agreeing on each group's id: one world id,
// one id per TP group (ranks r with the same r / tp) and per DP group (the same r % tp).
void ExpectNoGpuRefusal(const std::vector<absl::Status>& got, int tp) {
  const int world = static_cast<int>(got.size());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kFailedPrecondition) << r << ": " << got[r];
    EXPECT_NE(got[r].message().find("no CUDA device for this rank: cudaGetDeviceCount: "),
              std::string::npos)
        << got[r];
    ASSERT_EQ(Digest(got[r], "world").size(), 16u) << got[r];
    EXPECT_EQ(Digest(got[r], "world"), Digest(got[0], "world")) << "rank " << r;
    if (tp > 1) {
      EXPECT_EQ(Digest(got[r], "tp"), Digest(got[r / tp * tp], "tp")) << "rank " << r;
      EXPECT_NE(Digest(got[r], "tp"), "") << got[r];
    }
    if (world / tp > 1) {
      EXPECT_EQ(Digest(got[r], "dp"), Digest(got[r % tp], "dp")) << "rank " << r;
      EXPECT_NE(Digest(got[r], "dp"), "") << got[r];
    }
  }
  if (tp > 1 && world / tp > 1) {
    // Different groups, different ids.
    EXPECT_NE(Digest(got[0], "tp"), Digest(got[tp], "tp"));
    EXPECT_NE(Digest(got[0], "dp"), Digest(got[1], "dp"));
  }
}

TEST(NcclGroups, WithoutAGpuTheIdsAgreeThenTheMissingDeviceIsNamed) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present: the refusal cannot be observed";
  const auto start = std::chrono::steady_clock::now();
  ExpectNoGpuRefusal(FormNcclGroups(4, 2, std::make_shared<InMemoryStore>(), 0), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(NcclGroups, TheIdTravelsThroughTheTcpStore) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present: the refusal cannot be observed";
  ExpectNoGpuRefusal(FormNcclGroups(2, 1, nullptr, latchkey::testing::FreePort()), 1);
}

TEST(NcclStatus, CarriesTheNcclErrorStringVersionAndCallSite) {
  const absl::Status st = NcclStatus(ncclInvalidArgument, nullptr, "ncclAllReduce", "x.cc", 42);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << st;
  EXPECT_NE(st.message().find("ncclAllReduce at x.cc:42"), std::string::npos) << st;
  EXPECT_NE(st.message().find(NcclVersionString()), std::string::npos) << st;
  EXPECT_EQ(NcclVersionString().rfind("NCCL 2.", 0), 0u) << NcclVersionString();
  EXPECT_EQ(NcclStatus(ncclRemoteError, nullptr, "c", "f", 1).code(),
            absl::StatusCode::kUnavailable);
}

TEST(CudaDevice, AbsentDeviceIsNamedWithTheRuntimeError) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present";
  const absl::Status st = UseCudaDevice(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("no CUDA device cuda:1 for this rank: cudaGetDeviceCount: "),
            std::string::npos)
      << st;
}

TEST(NcclSelfTest, EveryCollectiveOnOneGpu) {
  if (!HaveGpu()) {
    GTEST_SKIP() << "no CUDA device: " << CudaDeviceCount().status().message();
  }
  std::vector<NcclSelfTestLine> lines;
  const absl::Status st = RunNcclSelfTest(0, &lines);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(lines.size(), NcclSelfTestCases());
  for (const auto& l : lines) EXPECT_TRUE(l.ok) << l.op << " " << l.dtype << ": " << l.detail;
}

// Two ranks (threads) on cuda:0 and cuda:1: the sums, gathers, scatters and broadcasts of
// inputs that differ per rank against the host's results.
TEST(NcclSelfTest, EveryCollectiveOnTwoGpus) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) GTEST_SKIP() << "no CUDA device: " << count.status().message();
  if (*count < 2) GTEST_SKIP() << "one CUDA device: the two-rank case needs two";
  std::vector<NcclSelfTestLine> lines;
  const absl::Status st = RunNcclTwoRankSelfTest(0, 1, &lines);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(lines.size(), NcclSelfTestCases());
  for (const auto& l : lines) EXPECT_TRUE(l.ok) << l.op << " " << l.dtype << ": " << l.detail;
}

}  // namespace
}  // namespace latchkey::comm
