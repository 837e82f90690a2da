// Asynchronous checkpoint saves (latchkey.checkpoint.async, the default) end to end with real
// latchkey-worker processes, standalone:
//  - a 24-layer n_embd 256 model (~253 MiB of fp32 state: parameters and both AdamW moments) on
//    one rank, checkpointing after steps 1, 3 and 5: killed (SIGKILL, common/crash_point.h) while
//    its background thread writes the checkpoint after step 3 (as the write begins, and once the
//    file is written but not committed), the newest valid checkpoint is still the one after
//    step 1; restarted with --resume it ends with every step's loss, grad norm and lr and the
//    final weights byte for byte those of an uninterrupted run. The uninterrupted run's JSONL
//    carries checkpoint_seconds on the saving steps and checkpoint_background_seconds on the
//    steps whose boundary committed them;
//  - TP 2 with a checkpoint after every step: each save commits at the next boundary (the last
//    step commits two), every folder is committed and nothing temporary is left, and the
//    metrics endpoint's latchkey_checkpoint_background_seconds (present at 0 from the start)
//    counts the commits with the JSONL's sum (promtool clean).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/free_port.h"
#include "tests/support/launch.h"
#include "tests/support/metrics_scrape.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/metrics/worker_metrics.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 6;  // checkpoints after steps 1, 3, 5; committed at the boundaries 2, 4, 5

// 24 layers, n_embd 256, 8 heads (MHA), vocabulary 12288, 32 positions: 22.1 M parameters, so
// the fp32 parameters and AdamW's two moments are ~253 MiB on one rank.
nlohmann::json BigSpec() {
  ModelShape m;
  m.n_layer = 24;
  m.n_embd = 256;
  m.n_head = 8;
  m.vocab_size = 12288;
  m.n_positions = 32;
  m.multi_query = false;
  SpecParams p = SingleRankParams();
  p.model = ModelJson(m);
  p.micro_batch = 1;
  p.gas = 1;
  p.seq_len = 32;
  p.steps = kSteps;
  p.seed = 5;
  p.optimizer = "AdamW";
  p.clip = 1.0;
  p.extra_latchkey["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 2}, {"keep", 2}};
  return SpecObject(p);
}

// Runs the one rank of the job in `dir` (spec.json there, JSONL appended to steps-0.jsonl).
int RunRank(const std::string& dir, const std::string& tag, const std::vector<std::string>& args,
            const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {WorkerBinary(),    "--standalone",
                                   "--spec",          dir + "/spec.json",
                                   "--metrics-jsonl", dir + "/steps-{rank}.jsonl",
                                   "--quiet"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> e = {"RANK=0", "WORLD_SIZE=1", "LOCAL_WORLD_SIZE=1",
                                "MASTER_ADDR=127.0.0.1",
                                "MASTER_PORT=" + std::to_string(FreePort())};
  e.insert(e.end(), env.begin(), env.end());
  const int pid = StartProcess(argv, e, dir + "/" + tag + "-stderr.txt");
  return pid > 0 ? WaitProcess(pid, std::chrono::seconds(540)) : -1;
}

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

std::map<int64_t, nlohmann::json> LastPerStep(const std::vector<nlohmann::json>& records) {
  std::map<int64_t, nlohmann::json> out;
  for (const auto& r : records) out[r["step"].get<int64_t>()] = r;
  return out;
}

std::string Entries(const std::string& dir) {
  std::vector<std::string> names;
  if (fs::exists(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : " ") + n;
  return out;
}

// The uninterrupted run, once for every test of the suite.
class AsyncCheckpointBig : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() {
    full_ = new ScopedTempDir("async-full");
    std::ofstream(full_->path() + "/spec.json") << BigSpec().dump(2);
    full_exit_ = RunRank(full_->path(), "full", {"--save", *full_ / "final"});
  }
  static void TearDownTestSuite() {
    delete full_;
    full_ = nullptr;
  }
  static ScopedTempDir* full_;
  static int full_exit_;
};
ScopedTempDir* AsyncCheckpointBig::full_ = nullptr;
int AsyncCheckpointBig::full_exit_ = -1;

TEST_P(AsyncCheckpointBig, KilledDuringABackgroundWriteThenResumedEqualsAnUninterruptedRun) {
  const std::string full = full_->path();
  ASSERT_EQ(full_exit_, 0) << ReadText(full + "/full-stderr.txt");
  EXPECT_EQ(Entries(full + "/ckpt"), "step-00000003 step-00000005");
  const std::vector<nlohmann::json> want_records = ReadJsonl(full + "/steps-0.jsonl");
  ASSERT_EQ(want_records.size(), static_cast<size_t>(kSteps));
  for (const auto& rec : want_records) {
    const int64_t s = rec["step"].get<int64_t>();
    // Blocked (the staging copy) on the saving steps; the background part on the committing
    // ones: the save after s commits after s + 1, the last one at the end of the run.
    EXPECT_EQ(rec.contains("checkpoint_seconds"), s % 2 == 1) << rec.dump();
    EXPECT_EQ(rec.contains("checkpoint_background_seconds"), s == 2 || s == 4 || s == 5)
        << rec.dump();
    if (rec.contains("checkpoint_seconds")) {
      EXPECT_GT(rec["checkpoint_seconds"], 0.0);
    }
    if (rec.contains("checkpoint_background_seconds")) {
      EXPECT_GT(rec["checkpoint_background_seconds"], 0.0);
    }
  }
  const auto want = LastPerStep(want_records);
  const std::string want_weights = ReadText(full + "/final/model.safetensors");
  ASSERT_FALSE(want_weights.empty());

  // Killed on the background thread while the checkpoint after step 3 is being written.
  const ScopedTempDir crashed("async-crashed");
  const std::string dir = crashed.path();
  std::ofstream(dir + "/spec.json") << BigSpec().dump(2);
  const int code =
      RunRank(dir, "crash", {},
              {std::string("LATCHKEY_TEST_CRASH=") + GetParam(), "LATCHKEY_TEST_CRASH_STEP=3"});
  EXPECT_EQ(code, 128 + SIGKILL) << ReadText(dir + "/crash-stderr.txt");
  // Step 3's record was written (its save blocked only for the staging); step 4's boundary,
  // where the save would have committed, never came.
  EXPECT_EQ(ReadJsonl(dir + "/steps-0.jsonl").size(), 4u);
  // The newest valid checkpoint is the one after step 1; step 3's is at most a temporary folder
  // (its file written, no manifest) or, killed as its write began, nothing.
  const std::string left = Entries(dir + "/ckpt");
  const bool written = std::string(GetParam()) == "checkpoint.after_rank_files";
  // The run's temporary folders carry its job uid, which its committed checkpoints name too.
  const nlohmann::json manifest = nlohmann::json::parse(
      ReadText(dir + "/ckpt/step-00000001/manifest.json"), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(manifest.is_object()) << left;
  const std::string temp = ".step-00000003." + manifest.value("job_uid", "") + ".a1.tmp";
  EXPECT_EQ(left, written ? temp + " step-00000001" : "step-00000001");
  const std::string partial = dir + "/ckpt/" + temp;
  EXPECT_FALSE(fs::exists(partial + "/manifest.json")) << left;
  EXPECT_EQ(fs::exists(partial + "/rank-00000.safetensors"), written) << left;

  const int resumed = RunRank(dir, "resume", {"--resume", "--save", dir + "/final"});
  const std::string err = ReadText(dir + "/resume-stderr.txt");
  ASSERT_EQ(resumed, 0) << err;
  EXPECT_NE(err.find("latchkey-worker: resuming from " + dir + "/ckpt/step-00000001"),
            std::string::npos)
      << err;
  const auto records = ReadJsonl(dir + "/steps-0.jsonl");
  ASSERT_EQ(records.size(), 8u);  // steps 0..3 of the killed run, then 2..5
  EXPECT_EQ(records[4]["step"], 2);
  const auto got = LastPerStep(records);
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  for (int64_t s = 0; s < kSteps; ++s) {
    EXPECT_EQ(got.at(s)["loss"], want.at(s)["loss"]) << "step " << s;
    EXPECT_EQ(got.at(s)["grad_norm"], want.at(s)["grad_norm"]) << "step " << s;
    EXPECT_EQ(got.at(s)["lr"], want.at(s)["lr"]) << "step " << s;
  }
  const std::string got_weights = ReadText(dir + "/final/model.safetensors");
  ASSERT_FALSE(got_weights.empty());
  EXPECT_TRUE(got_weights == want_weights)
      << "the resumed run's weights differ from the uninterrupted run's";
  // The resumed run's commits pruned the failed attempt's temporary folder and kept the two
  // newest besides the one it resumed from.
  EXPECT_EQ(Entries(dir + "/ckpt"), "step-00000001 step-00000003 step-00000005");
}

INSTANTIATE_TEST_SUITE_P(CrashPoints, AsyncCheckpointBig,
                         ::testing::Values("checkpoint.background_write",
                                           "checkpoint.after_rank_files"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "checkpoint.background_write"
                                      ? "AsTheWriteBegins"
                                      : "FileWrittenNotCommitted";
                         });

TEST(AsyncCheckpointMetrics, BackgroundSeriesExistFromTheStart) {
  const std::string text = WorkerMetrics().Serialize();
  for (const char* series : {"latchkey_checkpoint_background_seconds_count",
                             "latchkey_checkpoint_background_seconds_sum"}) {
    EXPECT_EQ(MetricSample(text, series), 0) << series << "\n" << text;
  }
}

TEST(AsyncCheckpointMetrics, EverySaveCommitsAtTheNextBoundaryAndIsCounted) {
  SpecParams p;  // TP 2 x DP 1, AdamW, ZeRO-1
  p.steps = 4;
  p.extra_latchkey["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 1}, {"keep", 4}};
  WorkerGroup g = StartWorkers(
      SpecObject(p), 2,
      {"--metrics-port", "0", "--metrics-host", "127.0.0.1", "--linger-seconds", "60"});
  const int port = WaitForRankMetricsPort(g, 0);
  ASSERT_GT(port, 0) << RankStderr(g, 0);
  const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", 4);
  ASSERT_EQ(MetricSample(text, "latchkey_optimizer_steps_total"), 4) << text;
  const Captured lint = PromtoolCheck(g.run.dir, text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;
  for (int pid : g.pids) kill(pid, SIGTERM);
  const WorkerRun run = WaitWorkers(std::move(g), std::chrono::seconds(30));

  EXPECT_EQ(Entries(run.dir + "/ckpt"), "step-00000000 step-00000001 step-00000002 step-00000003");
  EXPECT_EQ(MetricSample(text, "latchkey_checkpoint_seconds_count"), 4) << text;
  EXPECT_EQ(MetricSample(text, "latchkey_checkpoint_background_seconds_count"), 4) << text;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run.steps[r].size(), 4u) << run.Describe();
    for (const auto& rec : run.steps[r]) {
      EXPECT_TRUE(rec.contains("checkpoint_seconds")) << rec.dump();
      EXPECT_EQ(rec.contains("checkpoint_background_seconds"), rec["step"] != 0) << rec.dump();
    }
  }
  double blocked = 0, background = 0;
  for (const auto& rec : run.steps[0]) {
    blocked += rec["checkpoint_seconds"].get<double>();
    background += rec.value("checkpoint_background_seconds", 0.0);
  }
  EXPECT_NEAR(MetricSample(text, "latchkey_checkpoint_seconds_sum"), blocked, 1e-9) << text;
  EXPECT_NEAR(MetricSample(text, "latchkey_checkpoint_background_seconds_sum"), background, 1e-9)
      << text;
}

}  // namespace
}  // namespace latchkey::testing
