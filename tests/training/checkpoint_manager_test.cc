// The checkpoint manager (worker/checkpoint/checkpoint_manager.h) driven as the runner drives it,
// one AfterWindow per window on DP 2 (ranks as threads, tests/support/rank_threads.h), with a
// save on demand (SaveNow) between two cadence saves (every_steps 3, keep 1), synchronous and
// asynchronous: the save on demand holds exactly the state after its step (byte-identical rank
// files to a plain synchronous save of that state, manifest equal but for its creation time);
// it commits at once (synchronous) or at the next boundary (asynchronous), goes through
// on_commit like any save, and pruning keeps only the newest; a second SaveNow at the same
// boundary, or one with checkpoints disabled, saves nothing.
#include "worker/checkpoint/checkpoint_manager.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/job_uid.h"
#include "common/latch.h"
#include "tests/support/param_names.h"
#include "tests/support/process.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 6;
constexpr char kJob[] = "job-000001";

JobSpec MakeSpec(const std::string& root, bool async) {
  SpecParams p;
  p.tp = 1;
  p.world_size = kWorld;
  p.steps = kSteps;
  p.seed = 5;
  p.extra_latchkey["checkpoint"] = {
      {"dir", root}, {"every_steps", 3}, {"keep", 1}, {"async", async}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(SpecObject(p).dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

std::string ManifestWithoutTime(const std::string& step_dir) {
  nlohmann::json j = nlohmann::json::parse(ReadText(step_dir + "/manifest.json"));
  j.erase("created_unix_seconds");
  return j.dump();
}

std::vector<int64_t> Steps(const WindowCheckpoint& w) {
  std::vector<int64_t> out;
  for (const CommittedSave& c : w.committed) out.push_back(c.commit.step);
  return out;
}

class CheckpointManagerSaveNow : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(kWorld); }
};

TEST_P(CheckpointManagerSaveNow, SavesTheStateOnDemandAndCommitsAsTheSpecSays) {
  const bool async = GetParam();
  const ScopedTempDir dir("checkpoint-manager");
  const JobSpec spec = MakeSpec(dir / "ckpt", async);
  const std::string uid = NewJobUid();
  std::mutex mu;
  std::map<int, std::vector<int64_t>> reported;  // on_commit's steps, per rank
  RunRankThreads(kWorld, /*tp=*/1, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainingState& state = (*engine)->state();
    CheckpointSaver saver(/*async=*/true);  // the manager sets the spec's mode
    CheckpointManagerOptions o;
    o.config = spec.checkpoint;
    o.steps = kSteps;
    o.request.root = spec.checkpoint.dir;
    o.request.job_id = kJob;
    o.request.job_uid = uid;
    o.owner = CheckpointOwner(kJob, uid);
    o.rank = g.rank;
    o.world = g.world.get();
    o.world_size = g.world_size;
    o.on_commit = [&](const CommittedSave& c) {
      std::lock_guard<std::mutex> lock(mu);
      reported[g.rank].push_back(c.commit.step);
      return absl::OkStatus();
    };
    CheckpointManager manager(saver, o);
    EXPECT_TRUE(saver.async() == async);
    // Runs window s as the runner does and returns what its boundary committed.
    const auto window = [&](int64_t s) {
      const Latch latch = DecideLatch(spec, InitialPolicy(spec), s, spec.FirstMicroBatch(s));
      absl::StatusOr<StepReport> r = (*engine)->RunWindow(latch);
      EXPECT_TRUE(r.ok()) << "step " << s << ": " << r.status();
      absl::StatusOr<WindowCheckpoint> w = manager.AfterWindow(state, s);
      EXPECT_TRUE(w.ok()) << "step " << s << ": " << w.status();
      manager.Launch();
      return w.ok() ? Steps(*w) : std::vector<int64_t>{-1};
    };
    for (int64_t s = 0; s <= 1; ++s) EXPECT_TRUE(window(s).empty());
    // The cadence save after step 2: committed at once, or at the boundary after window 3.
    EXPECT_EQ(window(2), async ? std::vector<int64_t>{} : std::vector<int64_t>{2});
    EXPECT_EQ(window(3), async ? std::vector<int64_t>{2} : std::vector<int64_t>{});

    absl::StatusOr<WindowCheckpoint> now = manager.SaveNow(state, "preemption notice (test)");
    ASSERT_TRUE(now.ok()) << now.status();
    ASSERT_TRUE(now->blocked_seconds.has_value());
    EXPECT_EQ(Steps(*now), async ? std::vector<int64_t>{} : std::vector<int64_t>{3});
    EXPECT_EQ(manager.pending(), async);
    // A plain synchronous save of the same state, to compare the save on demand with.
    TrainingCheckpointRequest ref;
    ref.root = dir / "ref";
    ref.job_id = kJob;
    ref.job_uid = uid;
    ASSERT_TRUE(SaveTrainingCheckpoint(state, ref).ok());
    // The save of this boundary is under way (or done): nothing more to save.
    absl::StatusOr<WindowCheckpoint> again = manager.SaveNow(state, "again");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->committed.empty());
    EXPECT_FALSE(again->blocked_seconds.has_value());

    EXPECT_EQ(window(4), async ? std::vector<int64_t>{3} : std::vector<int64_t>{});
    EXPECT_FALSE(manager.pending());
    // The save on demand holds the state after step 3 (compared before keep 1 prunes it).
    const std::string name = CheckpointRankFileName(g.rank);
    const std::string want = ReadText(dir / ("ref/step-00000003/" + name));
    EXPECT_FALSE(want.empty()) << name;
    EXPECT_TRUE(ReadText(dir / ("ckpt/step-00000003/" + name)) == want)
        << name << " differs between the save on demand and a synchronous save";
    if (g.rank == 0) {
      EXPECT_EQ(ManifestWithoutTime(dir / "ckpt/step-00000003"),
                ManifestWithoutTime(dir / "ref/step-00000003"));
      EXPECT_FALSE(std::filesystem::exists(dir / "ckpt/step-00000002"))
          << "keep 1: pruned after step 3";
    }
    EXPECT_EQ(window(5), std::vector<int64_t>{5});  // the last window commits its own save
    EXPECT_TRUE(manager.CheckAllCommitted().ok());

    CheckpointManagerOptions off = o;
    off.config.dir.clear();
    CheckpointManager disabled(saver, off);
    EXPECT_EQ(disabled.SaveNow(state, "off").status().code(),
              absl::StatusCode::kFailedPrecondition);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(reported[r], (std::vector<int64_t>{2, 3, 5})) << "rank " << r;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt/step-00000003"))
      << "keep 1: pruned after step 5";
  EXPECT_TRUE(VerifyCheckpoint(dir / "ckpt/step-00000005", "").ok());
}

INSTANTIATE_TEST_SUITE_P(Mode, CheckpointManagerSaveNow, ::testing::Values(false, true),
                         BoolParamName("Async", "Sync"));

}  // namespace
}  // namespace latchkey::testing
