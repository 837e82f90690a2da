// Resumable checkpoints end to end with real latchkey-worker processes, standalone (no
// coordinator): 4 ranks (DP 2 x TP 2, ZeRO-1, AdamW, clipping, dropout) checkpoint every 2 steps.
// A run whose rank 1 is killed (SIGKILL) while writing the checkpoint after step 5 (saved
// asynchronously, the default, and synchronously), restarted on every rank with --resume, ignores
// the partial step-5 folder, resumes from step 3 and ends with the same per-step losses (the last
// JSONL record of each step) and byte-identical weights as an uninterrupted run. Also: the
// checkpoint series of the worker's metrics, present at 0 from the start and counting commits on
// the endpoint (promtool clean), --resume's refusals, and the JSONL of a fresh run against one of
// a resumed run.
#include <gtest/gtest.h>
#include <signal.h>

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
#include "tests/support/param_names.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/metrics/worker_metrics.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 4;
constexpr int kSteps = 8;

// DP 2 x TP 2, ZeRO-1 AdamW with clipping and dropout (so the generator states matter), a
// checkpoint after steps 1, 3, 5 and 7 into <spec folder>/ckpt, the two newest kept; saved
// asynchronously (the default) unless `async` is false.
nlohmann::json ResumeSpec(bool async = true) {
  SpecParams p;
  p.tp = 2;
  p.world_size = kWorld;
  p.zero_stage = 1;
  p.optimizer = "AdamW";
  p.clip = 0.5;
  p.steps = kSteps;
  p.seed = 11;
  p.model["resid_pdrop"] = 0.1;
  p.model["attn_pdrop"] = 0.1;
  p.model["embd_pdrop"] = 0.1;
  p.extra_latchkey["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 2}, {"keep", 2}};
  if (!async) p.extra_latchkey["checkpoint"]["async"] = false;
  return SpecObject(p);
}

struct Ranks {
  std::vector<int> exit_codes;
  std::vector<std::string> stderr_text;
  std::string Describe() const {
    std::string out;
    for (size_t r = 0; r < exit_codes.size(); ++r) {
      out += "\n  rank " + std::to_string(r) + " exit " + std::to_string(exit_codes[r]) + ": " +
             stderr_text[r];
    }
    return out;
  }
};

// Runs every rank of the job in `dir` (spec.json there, JSONL appended to steps-R.jsonl there)
// on a fresh MASTER_PORT, with `args` after the standard ones and `env` added.
Ranks RunRanks(const std::string& dir, const std::string& tag, const std::vector<std::string>& args,
               const std::vector<std::string>& env = {},
               std::chrono::seconds deadline = std::chrono::seconds(300)) {
  const int port = FreePort();
  std::vector<int> pids;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> argv = {WorkerBinary(),    "--standalone",
                                     "--spec",          dir + "/spec.json",
                                     "--metrics-jsonl", dir + "/steps-{rank}.jsonl",
                                     "--quiet"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> e = {"RANK=" + std::to_string(r),
                                  "WORLD_SIZE=" + std::to_string(kWorld),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(kWorld),
                                  "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
    e.insert(e.end(), env.begin(), env.end());
    pids.push_back(
        StartProcess(argv, e, dir + "/" + tag + "-stderr-" + std::to_string(r) + ".txt"));
  }
  Ranks out;
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (int r = 0; r < kWorld; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    out.exit_codes.push_back(
        pids[r] > 0 ? WaitProcess(pids[r], std::max(left, std::chrono::milliseconds(0))) : -1);
  }
  for (int r = 0; r < kWorld; ++r) {
    out.stderr_text.push_back(ReadText(dir + "/" + tag + "-stderr-" + std::to_string(r) + ".txt"));
  }
  return out;
}

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The last record of every step.
std::map<int64_t, nlohmann::json> LastPerStep(const std::vector<nlohmann::json>& records) {
  std::map<int64_t, nlohmann::json> out;
  for (const auto& r : records) out[r["step"].get<int64_t>()] = r;
  return out;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

// The parameter: latchkey.checkpoint.async.
class StandaloneResume : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::ofstream(full_.path() + "/spec.json") << ResumeSpec(GetParam()).dump(2);
    std::ofstream(crashed_.path() + "/spec.json") << ResumeSpec(GetParam()).dump(2);
  }
  ScopedTempDir full_{"resume-full"};
  ScopedTempDir crashed_{"resume-crashed"};
};

TEST_P(StandaloneResume, KilledDuringACheckpointThenResumedEqualsAnUninterruptedRun) {
  // (a) Uninterrupted.
  const Ranks a = RunRanks(full_.path(), "full", {"--save", full_ / "final"});
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(a.exit_codes[r], 0) << a.Describe();
  // keep 2: the checkpoints after steps 5 and 7 remain, nothing temporary.
  EXPECT_EQ(Joined(Entries(full_ / "ckpt")), "step-00000005 step-00000007");
  std::vector<std::map<int64_t, nlohmann::json>> want(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    const auto records = ReadJsonl(full_ / ("steps-" + std::to_string(r) + ".jsonl"));
    ASSERT_EQ(records.size(), static_cast<size_t>(kSteps)) << "rank " << r;
    for (const auto& rec : records) {
      const int64_t s = rec["step"].get<int64_t>();
      EXPECT_EQ(rec.contains("checkpoint_seconds"), (s + 1) % 2 == 0) << rec.dump();
      if (rec.contains("checkpoint_seconds")) {
        EXPECT_GT(rec["checkpoint_seconds"].get<double>(), 0.0) << rec.dump();
      }
    }
    want[r] = LastPerStep(records);
  }
  const std::string want_weights = ReadText(full_ / "final/model.safetensors");
  ASSERT_FALSE(want_weights.empty());

  // (b) Rank 1 killed once its file of the checkpoint after step 5 is written; the others fail
  // in the checkpoint's confirmation (a short collective timeout in case the peer's sockets do
  // not close at once).
  const Ranks b = RunRanks(crashed_.path(), "crash", {"--collective-timeout-seconds", "5"},
                           {"LATCHKEY_TEST_CRASH=checkpoint.after_rank_files",
                            "LATCHKEY_TEST_CRASH_RANK=1", "LATCHKEY_TEST_CRASH_STEP=5"},
                           std::chrono::seconds(180));
  EXPECT_EQ(b.exit_codes[1], 128 + SIGKILL) << b.Describe();
  for (int r : {0, 2, 3}) EXPECT_EQ(b.exit_codes[r], 1) << b.Describe();
  const std::vector<std::string> left = Entries(crashed_ / "ckpt");
  EXPECT_EQ(std::count(left.begin(), left.end(), "step-00000003"), 1) << Joined(left);
  EXPECT_EQ(std::count(left.begin(), left.end(), "step-00000005"), 0) << Joined(left);
  // The partial folder of step 5 is there, with rank 1's file and no manifest.
  // Named after the run's job uid, which its committed checkpoints carry too.
  const nlohmann::json manifest =
      nlohmann::json::parse(ReadText(crashed_ / "ckpt/step-00000003/manifest.json"), nullptr,
                            /*allow_exceptions=*/false);
  ASSERT_TRUE(manifest.is_object()) << Joined(left);
  const std::string partial =
      crashed_ / ("ckpt/.step-00000005." + manifest.value("job_uid", "") + ".a1.tmp");
  EXPECT_TRUE(fs::exists(partial + "/rank-00001.safetensors")) << Joined(left);
  EXPECT_FALSE(fs::exists(partial + "/manifest.json"));
  // Every rank ran steps 0..4; step 5 ran but never finished its checkpoint. Synchronous: step
  // 5's record never came (the save blocks until it commits). Asynchronous: it did (the save
  // blocked only for the staging), and no rank recorded step 6, whose boundary the commit
  // that never happened belongs to.
  const size_t crashed_records = GetParam() ? 6 : 5;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ReadJsonl(crashed_ / ("steps-" + std::to_string(r) + ".jsonl")).size(),
              crashed_records)
        << "rank " << r << b.Describe();
  }

  // (c) Every rank restarted with --resume.
  const Ranks c = RunRanks(crashed_.path(), "resume", {"--resume", "--save", crashed_ / "final"});
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(c.exit_codes[r], 0) << c.Describe();
  EXPECT_NE(c.stderr_text[0].find("latchkey-worker: resuming from " + (crashed_ / "ckpt") +
                                  "/step-00000003"),
            std::string::npos)
      << c.stderr_text[0];
  for (int r = 0; r < kWorld; ++r) {
    const auto records = ReadJsonl(crashed_ / ("steps-" + std::to_string(r) + ".jsonl"));
    // Appended: steps 0..4 (and 5, asynchronous) of the killed run, then 4..7 of the resumed
    // one.
    ASSERT_EQ(records.size(), crashed_records + 4) << "rank " << r;
    EXPECT_EQ(records[crashed_records]["step"], 4) << "rank " << r;
    const auto got = LastPerStep(records);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << "rank " << r;
    for (int64_t s = 0; s < kSteps; ++s) {
      EXPECT_EQ(got.at(s)["loss"], want[r].at(s)["loss"]) << "rank " << r << " step " << s;
      EXPECT_EQ(got.at(s)["grad_norm"], want[r].at(s)["grad_norm"])
          << "rank " << r << " step " << s;
      EXPECT_EQ(got.at(s)["lr"], want[r].at(s)["lr"]) << "rank " << r << " step " << s;
    }
  }
  const std::string got_weights = ReadText(crashed_ / "final/model.safetensors");
  ASSERT_FALSE(got_weights.empty());
  EXPECT_TRUE(got_weights == want_weights)
      << "the resumed run's weights differ from the uninterrupted run's (" << full_.path() << ", "
      << crashed_.path() << ")";
  // The resumed run's commits removed the partial folder and pruned to the two newest, but
  // never the checkpoint the run resumed from.
  EXPECT_EQ(Joined(Entries(crashed_ / "ckpt")), "step-00000003 step-00000005 step-00000007");
}

TEST_P(StandaloneResume, ResumeWithoutACheckpointStartsAtStepZero) {
  const Ranks r = RunRanks(full_.path(), "fresh", {"--resume"});
  for (int k = 0; k < kWorld; ++k) ASSERT_EQ(r.exit_codes[k], 0) << r.Describe();
  EXPECT_NE(r.stderr_text[0].find("latchkey-worker: no checkpoint in " + (full_ / "ckpt") +
                                  ": starting at step 0"),
            std::string::npos)
      << r.stderr_text[0];
  EXPECT_EQ(ReadJsonl(full_ / "steps-0.jsonl").size(), static_cast<size_t>(kSteps));
}

INSTANTIATE_TEST_SUITE_P(Saves, StandaloneResume, ::testing::Values(true, false),
                         BoolParamName("Async", "Sync"));

// --metrics-jsonl across runs into the same files: a fresh run (no --resume) starts each rank's
// file afresh, so two runs' records never mix; a resumed run appends to what the run it resumes
// wrote (synchronous saves, so the killed run's last record is step 4's).
TEST(StandaloneJsonl, AFreshRunStartsTheFileAfreshAResumedRunAppends) {
  ScopedTempDir dir("jsonl-fresh");
  std::ofstream(dir / "spec.json") << ResumeSpec(false).dump(2);
  const auto records = [&](int r) {
    return ReadJsonl(dir / ("steps-" + std::to_string(r) + ".jsonl"));
  };
  const Ranks first = RunRanks(dir.path(), "first", {});
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(first.exit_codes[r], 0) << first.Describe();
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(records(r).size(), size_t{kSteps}) << "rank " << r;
  // A second fresh run (its checkpoints too), killed while saving after step 5: only its own
  // records, steps 0..4.
  fs::remove_all(dir / "ckpt");
  const Ranks second = RunRanks(dir.path(), "second", {"--collective-timeout-seconds", "5"},
                                {"LATCHKEY_TEST_CRASH=checkpoint.after_rank_files",
                                 "LATCHKEY_TEST_CRASH_RANK=1", "LATCHKEY_TEST_CRASH_STEP=5"},
                                std::chrono::seconds(180));
  EXPECT_EQ(second.exit_codes[1], 128 + SIGKILL) << second.Describe();
  for (int r = 0; r < kWorld; ++r) {
    const auto got = records(r);
    ASSERT_EQ(got.size(), 5u) << "rank " << r << second.Describe();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i]["step"], static_cast<int64_t>(i)) << "rank " << r;
      EXPECT_EQ(got[i]["rank"], r);
    }
  }
  // Resumed from step 3: the second run's five records, then steps 4..7.
  const Ranks third = RunRanks(dir.path(), "third", {"--resume"});
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(third.exit_codes[r], 0) << third.Describe();
  for (int r = 0; r < kWorld; ++r) {
    const auto got = records(r);
    ASSERT_EQ(got.size(), 9u) << "rank " << r;
    const std::vector<int64_t> want = {0, 1, 2, 3, 4, 4, 5, 6, 7};
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i]["step"], want[i]) << "rank " << r << " record " << i;
    }
  }
}

TEST(StandaloneResumeUsage, ResumeNeedsLatchkeyCheckpoint) {
  ScopedTempDir dir("resume-usage");
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  p.steps = 1;
  std::ofstream(dir / "spec.json") << SpecJson(p);
  const Captured c =
      RunAndCapture({WorkerBinary(), "--standalone", "--spec", dir / "spec.json", "--resume"});
  EXPECT_EQ(c.exit_code, 2) << c.output;
  EXPECT_NE(c.output.find("latchkey.checkpoint"), std::string::npos) << c.output;
}

TEST(CheckpointMetrics, SeriesExistFromTheStart) {
  const std::string text = WorkerMetrics().Serialize();
  for (const char* series :
       {"latchkey_checkpoint_seconds_count", "latchkey_checkpoint_seconds_sum",
        "latchkey_checkpoint_bytes_total", "latchkey_last_checkpoint_timestamp_seconds",
        "latchkey_checkpoint_failures_total"}) {
    EXPECT_EQ(MetricSample(text, series), 0) << series << "\n" << text;
  }
}

TEST(CheckpointMetrics, EndpointCountsCommitsAndPassesPromtool) {
  SpecParams p;  // TP 2 x DP 1, AdamW, ZeRO-1
  p.steps = 4;
  p.extra_latchkey["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 2}};
  WorkerGroup g = StartWorkers(
      SpecObject(p), 2,
      {"--metrics-port", "0", "--metrics-host", "127.0.0.1", "--linger-seconds", "60"});
  const int port = WaitForRankMetricsPort(g, 0);
  ASSERT_GT(port, 0) << RankStderr(g, 0);
  const double started =
      static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
  const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", 4);
  ASSERT_EQ(MetricSample(text, "latchkey_optimizer_steps_total"), 4) << text;
  const Captured lint = PromtoolCheck(g.run.dir, text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;
  for (int pid : g.pids) kill(pid, SIGTERM);
  const WorkerRun run = WaitWorkers(std::move(g), std::chrono::seconds(30));

  // Two commits (after steps 1 and 3), both kept; bytes count every rank's file of each.
  EXPECT_EQ(MetricSample(text, "latchkey_checkpoint_seconds_count"), 2) << text;
  double bytes = 0;
  for (const char* step : {"step-00000001", "step-00000003"}) {
    for (const char* file : {"rank-00000.safetensors", "rank-00001.safetensors"}) {
      bytes += static_cast<double>(fs::file_size(run.dir + "/ckpt/" + step + "/" + file));
    }
  }
  EXPECT_EQ(MetricSample(text, "latchkey_checkpoint_bytes_total"), bytes) << text;
  const double ts = MetricSample(text, "latchkey_last_checkpoint_timestamp_seconds");
  EXPECT_GE(ts, started - 1) << text;
  EXPECT_LE(ts, started + 600) << text;
  // The JSONL's checkpoint_seconds of the saving steps sum to the histogram's.
  ASSERT_EQ(run.steps[0].size(), 4u) << run.Describe();
  double sum = 0;
  for (const auto& rec : run.steps[0]) {
    if (rec.contains("checkpoint_seconds")) sum += rec["checkpoint_seconds"].get<double>();
  }
  EXPECT_NEAR(MetricSample(text, "latchkey_checkpoint_seconds_sum"), sum, 1e-9) << text;
}

}  // namespace
}  // namespace latchkey::testing
