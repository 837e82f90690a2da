// The asynchronous save writes exactly what the synchronous one does: on DP 2 x TP 2 (ZeRO-1
// AdamW, fp32 and bf16, dropout), the state after step 2 saved synchronously and then through
// the runner's CheckpointSaver (staged, written on its background thread while window 3 trains
// and changes the state, committed at the boundary after window 3) gives byte-identical rank
// files and manifests that differ only in their creation time. The staging buffers are reused by
// the next save (same bytes held), and a save cannot start while one is pending. Ranks run as
// threads (tests/support/rank_threads.h).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include "common/latch.h"
#include "tests/support/param_names.h"
#include "tests/support/process.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/checkpoint_saver.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kTp = 2;
constexpr int kSteps = 6;

JobSpec MakeSpec(bool bf16) {
  SpecParams p;
  p.tp = kTp;
  p.world_size = kWorld;
  p.clip = 0.5;
  p.steps = kSteps;
  p.seed = 3;
  p.model["resid_pdrop"] = 0.1;
  p.model["attn_pdrop"] = 0.1;
  nlohmann::json spec = SpecObject(p);
  if (bf16) spec["bf16"] = {{"enabled", true}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(spec.dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

void RunOne(Engine& engine, const JobSpec& spec, int64_t s) {
  const Latch latch = DecideLatch(spec, InitialPolicy(spec), s, spec.FirstMicroBatch(s));
  absl::StatusOr<StepReport> r = engine.RunWindow(latch);
  ASSERT_TRUE(r.ok()) << "step " << s << ": " << r.status();
}

std::string ManifestWithoutTime(const std::string& step_dir) {
  nlohmann::json j = nlohmann::json::parse(ReadText(step_dir + "/manifest.json"));
  j.erase("created_unix_seconds");
  return j.dump();
}

class AsyncSave : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(kWorld); }
};

TEST_P(AsyncSave, WritesWhatTheSynchronousSaveWritesWhileTrainingGoesOn) {
  const JobSpec spec = MakeSpec(GetParam());
  const ScopedTempDir dir("async-save");
  std::mutex mu;
  std::map<int, int64_t> staged_bytes, staged_again;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainingState& state = (*engine)->state();
    for (int64_t s = 0; s <= 2; ++s) RunOne(**engine, spec, s);
    TrainingCheckpointRequest sync_req;
    sync_req.root = dir / "sync";
    ASSERT_TRUE(SaveTrainingCheckpoint(state, sync_req).ok());

    TrainingCheckpointRequest req;
    req.root = dir / "async";
    CheckpointSaver saver(/*async=*/true);
    double blocked = 0;
    auto started = saver.Start(state, req, g.rank, &blocked);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_FALSE(started->has_value());  // staged, not committed
    EXPECT_GT(blocked, 0.0);
    EXPECT_EQ(saver.pending_step(), 2);
    EXPECT_EQ(saver.Start(state, req, g.rank, &blocked).status().code(),
              absl::StatusCode::kFailedPrecondition);
    saver.Launch();
    // Nothing commits at the saving step's own boundary (it is not the last window).
    auto early = saver.CommitDue(state, 2, kSteps);
    ASSERT_TRUE(early.ok()) << early.status();
    EXPECT_FALSE(early->has_value());
    RunOne(**engine, spec, 3);  // changes every buffer the staged copy was taken from
    auto due = saver.CommitDue(state, 3, kSteps);
    ASSERT_TRUE(due.ok()) << due.status();
    ASSERT_TRUE(due->has_value());
    const CommittedSave& c = **due;
    EXPECT_EQ(c.commit.step, 2);
    EXPECT_EQ(c.commit.dir, dir / "async/step-00000002");
    EXPECT_EQ(c.commit.blocked_seconds, blocked);
    ASSERT_TRUE(c.background_seconds.has_value());
    EXPECT_GE(*c.background_seconds, c.write_seconds);
    EXPECT_FALSE(saver.pending());
    {
      std::lock_guard<std::mutex> lock(mu);
      staged_bytes[g.rank] = saver.staged().bytes();
    }
    // The next save reuses the buffers; the run's last window commits its own save at once.
    RunOne(**engine, spec, 4);
    RunOne(**engine, spec, 5);
    ASSERT_TRUE(saver.Start(state, req, g.rank, &blocked).ok());
    auto last = saver.CommitDue(state, 5, kSteps);
    ASSERT_TRUE(last.ok()) << last.status();
    ASSERT_TRUE(last->has_value());
    EXPECT_EQ((*last)->commit.step, 5);
    std::lock_guard<std::mutex> lock(mu);
    staged_again[g.rank] = saver.staged().bytes();
  });
  for (int r = 0; r < kWorld; ++r) {
    const std::string name = CheckpointRankFileName(r);
    const std::string want = ReadText(dir / ("sync/step-00000002/" + name));
    ASSERT_FALSE(want.empty()) << name;
    EXPECT_TRUE(ReadText(dir / ("async/step-00000002/" + name)) == want)
        << name << " differs between the synchronous and the asynchronous save";
    EXPECT_GT(staged_bytes[r], 0) << "rank " << r;
    EXPECT_EQ(staged_again[r], staged_bytes[r]) << "rank " << r;
  }
  EXPECT_EQ(ManifestWithoutTime(dir / "async/step-00000002"),
            ManifestWithoutTime(dir / "sync/step-00000002"));
  EXPECT_TRUE(VerifyCheckpoint(dir / "async/step-00000005", "").ok());
}

INSTANTIATE_TEST_SUITE_P(Precision, AsyncSave, ::testing::Values(false, true),
                         BoolParamName("Bf16", "Fp32"));

}  // namespace
}  // namespace latchkey::testing
