// A job asking for cuda on a machine without a CUDA device fails at once, on every rank, naming
// the missing device and the CUDA runtime's error: real latchkey-worker processes standalone,
// and a real coordinator job through `latchkey up` (the job fails with that reason). With the
// device check left to the nccl backend (LATCHKEY_TEST_SKIP_DEVICE_CHECK=1), the NCCL unique
// ids travel through the rendezvous store (standalone) and the coordinator's rendezvous, and
// every rank reports the same bytes (their SHA-256) before the device is found missing.
// Skipped, with the reason, where a CUDA device is present.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/device/cuda_runtime.h"

namespace latchkey::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWorld = 2;

nlohmann::json CudaSpec(int tp) {
  SpecParams p;
  p.tp = tp;
  p.world_size = kWorld;
  p.steps = 2;
  p.extra_latchkey = {{"device", "cuda"}};  // the default latchkey.max_restarts (3)
  return SpecObject(p);
}

// What every rank must say: the device it asked for and why there is none.
std::string NoDevice(int rank) {
  return "no CUDA device cuda:" + std::to_string(rank) + " for this rank: " +
         (BuiltWithCuda() ? "cudaGetDeviceCount: " : "this latchkey-worker was built");
}

// The world group's id digest a rank reported ("" when none).
std::string WorldDigest(const std::string& text) {
  std::smatch m;
  return std::regex_search(text, m, std::regex("agreed by every rank \\(world sha256 ([0-9a-f]+)"))
             ? m[1].str()
             : "";
}

class NoGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount().ok()) GTEST_SKIP() << "a CUDA device is present";
  }
  void TearDown() override { unsetenv("LATCHKEY_TEST_SKIP_DEVICE_CHECK"); }
};

TEST_F(NoGpu, StandaloneRanksFailAtOnceNamingTheDevice) {
  const auto start = Clock::now();
  WorkerRun run = RunWorkers(CudaSpec(2), kWorld, {}, std::chrono::seconds(60));
  // "At once": before any wait on the peers (the rendezvous and collective timeouts, 120 s, or
  // the 60 s deadline above, which kills the ranks). Two libtorch processes start in seconds;
  // half the deadline leaves two loaded cores room and still fails a rank that waits.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.exit_codes[r], 1) << run.Describe();
    EXPECT_NE(run.stderr_text[r].find("latchkey.device: \"cuda\": " + NoDevice(r)),
              std::string::npos)
        << run.stderr_text[r];
  }
}

TEST_F(NoGpu, StandaloneUniqueIdTravelsThroughTheStoreToEveryRank) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without LATCHKEY_CUDA";
  setenv("LATCHKEY_TEST_SKIP_DEVICE_CHECK", "1", 1);
  WorkerRun run = RunWorkers(CudaSpec(2), kWorld, {}, std::chrono::seconds(60));
  const std::string digest = WorldDigest(run.stderr_text[0]);
  ASSERT_EQ(digest.size(), 16u) << run.Describe();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.exit_codes[r], 1) << run.Describe();
    EXPECT_EQ(WorldDigest(run.stderr_text[r]), digest) << run.stderr_text[r];
    EXPECT_NE(run.stderr_text[r].find("no CUDA device for this rank: cudaGetDeviceCount: "),
              std::string::npos)
        << run.stderr_text[r];
  }
}

// `latchkey up` of CudaSpec in `dir` (`no_restarts`: with --max-restarts 0); returns its exit
// code, `log` gets its output.
int Up(const std::string& dir, std::string* log, bool no_restarts) {
  std::ofstream(dir + "/spec.json") << CudaSpec(2).dump(2);
  std::vector<std::string> args = {LATCHKEY_CLI_BIN,   "up",        "--spec",
                                   dir + "/spec.json", "--run-dir", dir + "/run"};
  if (no_restarts) args.insert(args.end(), {"--max-restarts", "0"});
  const int pid = StartProcess(args, {}, dir + "/up.log");
  const int code = WaitProcess(pid, std::chrono::seconds(120));
  *log = ReadText(dir + "/up.log");
  return code;
}

// The reason in up's "latchkey: JOB failed: REASON" line.
std::string FailedReason(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("latchkey: \\S+ failed: ([^\n]*)")) ? m[1].str() : "";
}

TEST_F(NoGpu, CoordinatorJobFailsWithTheMissingDevice) {
  const ScopedTempDir dir("no-gpu-up");
  const auto start = Clock::now();
  std::string log;
  // The spec allows 3 restarts: a missing device is a configuration error, never retried.
  const int code = Up(dir.path(), &log, /*no_restarts=*/false);
  EXPECT_EQ(code, 10) << "expected exit 10 (job failed)\n" << log;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << log;
  const std::string reason = FailedReason(log);
  EXPECT_NE(reason.find("latchkey.device: \"cuda\": no CUDA device cuda:"), std::string::npos)
      << log;
  EXPECT_NE(reason.find("(a configuration error: not retried)"), std::string::npos) << log;
  EXPECT_EQ(log.find("recovery attempt"), std::string::npos) << log;
  // Each rank names its own device, or (joining after the job already failed) the one that
  // failed it.
  for (int r = 0; r < kWorld; ++r) {
    const std::string wlog = ReadText(dir.path() + "/run/worker-" + std::to_string(r) + ".log");
    const bool own = wlog.find(NoDevice(r)) != std::string::npos;
    const bool peer = wlog.find("already ended (failed)") != std::string::npos &&
                      wlog.find(NoDevice(1 - r)) != std::string::npos;
    EXPECT_TRUE(own || peer) << "worker " << r << ":\n" << wlog;
  }
}

TEST_F(NoGpu, CoordinatorRendezvousCarriesTheSameUniqueIdToEveryRank) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without LATCHKEY_CUDA";
  setenv("LATCHKEY_TEST_SKIP_DEVICE_CHECK", "1", 1);
  const ScopedTempDir dir("no-gpu-up-id");
  std::string log;
  const int code = Up(dir.path(), &log, /*no_restarts=*/true);
  EXPECT_EQ(code, 10) << log;
  EXPECT_NE(FailedReason(log).find("no CUDA device for this rank"), std::string::npos) << log;
  std::string digest;
  for (int r = 0; r < kWorld; ++r) {
    const std::string wlog = ReadText(dir.path() + "/run/worker-" + std::to_string(r) + ".log");
    const std::string d = WorldDigest(wlog);
    ASSERT_EQ(d.size(), 16u) << "worker " << r << ":\n" << wlog;
    if (r == 0) digest = d;
    EXPECT_EQ(d, digest) << "worker " << r << " got other bytes:\n" << wlog;
  }
}

}  // namespace
}  // namespace latchkey::testing
