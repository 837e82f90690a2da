// A save that finds no room (docs/fault-tolerance.md, "Disk full"), through the checkpoint
// manager (worker/checkpoint/checkpoint_manager.h) on DP 2, ranks as threads, without root: the
// save after step 3 writes one of its files through a symlink to /dev/full (every write fails
// with ENOSPC), rank 1's file or rank 0's manifest. Every rank drops the save alike (not_saved,
// no error), nothing of it is left (no temporary folder, no step-00000003), the save after
// step 1 stays, the next save (after step 5) commits, and each rank counts the dropped save.
// Any other write error (EISDIR: the file is a folder) still fails every rank. Synchronous and
// asynchronous saves. The same on a real full disk, with worker processes: checkpoint_disk_full_
// test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/error_info.h"
#include "common/job_uid.h"
#include "common/latch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/checkpoint_manager.h"
#include "worker/checkpoint/save_failures.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

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
      {"dir", root}, {"every_steps", 2}, {"keep", 5}, {"async", async}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(SpecObject(p).dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

// What the save after step 3 meets: `file` of its temporary folder is a symlink to `target`.
struct Trap {
  const char* name;
  const char* file;    // in the temporary folder
  const char* target;  // "" : a folder of the test's
  bool dropped;        // lack of room (dropped) or another error (every rank fails)
  bool async;
};

void PrintTo(const Trap& t, std::ostream* os) { *os << t.name; }

class NoRoom : public ::testing::TestWithParam<Trap> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(kWorld); }
};

TEST_P(NoRoom, TheSaveIsDroppedOnEveryRankOrTheAttemptFails) {
  const Trap trap = GetParam();
  const ScopedTempDir dir("no-room");
  const JobSpec spec = MakeSpec(dir / "ckpt", trap.async);
  const std::string uid = NewJobUid();
  const std::string temp = dir / ("ckpt/" + CheckpointTempDirName(3, uid, 1));
  const int64_t failures_before = CheckpointSaveFailures();
  RunRankThreads(kWorld, /*tp=*/1, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainingState& state = (*engine)->state();
    CheckpointSaver saver(trap.async);
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
    CheckpointManager manager(saver, o);
    std::vector<int64_t> committed;
    std::vector<int64_t> not_saved;
    for (int64_t s = 0; s < kSteps; ++s) {
      const Latch latch = DecideLatch(spec, InitialPolicy(spec), s, spec.FirstMicroBatch(s));
      absl::StatusOr<StepReport> r = (*engine)->RunWindow(latch);
      ASSERT_TRUE(r.ok()) << "step " << s << ": " << r.status();
      // Window 3's collectives ran on both ranks: rank 0 has pruned after the commit of step 1
      // (which removes the job's temporary folders), so the trap stays until the save meets it.
      if (s == 3 && g.rank == 1) {
        fs::create_directories(temp);
        const std::string target = *trap.target != 0 ? trap.target : dir / "a-folder";
        fs::create_directories(dir / "a-folder");
        fs::create_symlink(target, temp + "/" + trap.file);
      }
      absl::StatusOr<WindowCheckpoint> w = manager.AfterWindow(state, s);
      if (!trap.dropped && s == (trap.async ? 4 : 3)) {
        // Every rank fails, as for any write error: the attempt is over.
        EXPECT_FALSE(w.ok()) << "rank " << g.rank;
        EXPECT_FALSE(HasErrorReason(w.status(), error_reason::kCheckpointOutOfSpace));
        return;
      }
      ASSERT_TRUE(w.ok()) << "rank " << g.rank << " step " << s << ": " << w.status();
      for (const CommittedSave& c : w->committed) committed.push_back(c.commit.step);
      not_saved.insert(not_saved.end(), w->not_saved.begin(), w->not_saved.end());
      if (w->not_saved.size() == 1) {
        EXPECT_EQ(s, trap.async ? 4 : 3) << "rank " << g.rank;
        EXPECT_TRUE(w->blocked_seconds.has_value() || trap.async);
      }
      manager.Launch();
    }
    EXPECT_TRUE(manager.CheckAllCommitted().ok());
    EXPECT_EQ(committed, (std::vector<int64_t>{1, 5})) << "rank " << g.rank;
    EXPECT_EQ(not_saved, (std::vector<int64_t>{3})) << "rank " << g.rank;
  });
  if (!trap.dropped) {
    EXPECT_EQ(CheckpointSaveFailures(), failures_before);
    EXPECT_FALSE(fs::exists(dir / "ckpt/step-00000003"));
    return;
  }
  EXPECT_EQ(CheckpointSaveFailures() - failures_before, kWorld);  // one per rank (thread)
  EXPECT_FALSE(fs::exists(temp)) << "the dropped save's temporary folder";
  EXPECT_FALSE(fs::exists(dir / "ckpt/step-00000003"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir / "ckpt")) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000001", "step-00000005"}));
  EXPECT_TRUE(VerifyCheckpoint(dir / "ckpt/step-00000001", "").ok());
  EXPECT_TRUE(VerifyCheckpoint(dir / "ckpt/step-00000005", "").ok());
}

INSTANTIATE_TEST_SUITE_P(
    checkpoint, NoRoom,
    ::testing::Values(Trap{"rank_file_sync", "rank-00001.safetensors", "/dev/full", true, false},
                      Trap{"rank_file_async", "rank-00001.safetensors", "/dev/full", true, true},
                      Trap{"manifest_sync", "manifest.json.tmp", "/dev/full", true, false},
                      Trap{"manifest_async", "manifest.json.tmp", "/dev/full", true, true},
                      Trap{"other_error_sync", "rank-00001.safetensors", "", false, false},
                      Trap{"other_error_async", "rank-00001.safetensors", "", false, true}),
    [](const ::testing::TestParamInfo<Trap>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace latchkey::testing
