// A diverging training (SGD at lr 1e9) in every parallel mode. In process (engine ranks as
// threads): the first window whose loss or global grad norm is not finite is reported so on every
// rank at the same step, and is not applied: the parameters (and the bf16 master) are bitwise
// those before it, the data position is the previous window's. With real standalone worker
// processes: every rank exits kExitTrainingDiverged naming the quantity, the step and its rank,
// its JSONL ends with that step's record (loss or grad_norm null), and the checkpoints saved
// every step end with the step before it, which verifies.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "common/latch.h"
#include "common/worker_protocol.h"
#include "tests/support/launch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/model/param_store.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxSteps = 8;  // SGD at lr 1e9 diverges well before

struct Mode {
  std::string name;
  int world = 2;
  int tp = 2;
  int zero = 0;
  bool bf16 = false;
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

nlohmann::json DivergingSpec(const Mode& m) {
  SpecParams p;  // synthetic data
  p.optimizer = "SGD";
  p.lr = 1e9;
  p.tp = m.tp;
  p.world_size = m.world;
  p.zero_stage = m.zero;
  p.gas = 2;
  p.micro_batch = 1;
  p.seq_len = 16;
  p.steps = kMaxSteps;
  nlohmann::json spec = SpecObject(p);
  if (m.bf16) spec["bf16"] = {{"enabled", true}};
  return spec;
}

Latch LatchFor(const JobSpec& spec, int64_t window) {
  Latch l = DecideLatch(spec, InitialPolicy(spec), window, spec.FirstMicroBatch(window));
  l.first_sample = l.first_micro_batch * (spec.world_size / spec.tp) * spec.micro_batch_size;
  return l;
}

class DivergeInProcess : public ::testing::TestWithParam<Mode> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(4); }
};

TEST_P(DivergeInProcess, TheFirstNonFiniteWindowIsNotAppliedOnAnyRank) {
  const Mode& m = GetParam();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(DivergingSpec(m).dump(), "/");
  ASSERT_TRUE(spec.ok()) << spec.status();
  struct Outcome {
    int64_t diverged = -1;
    bool params_kept = false;
    bool master_kept = false;
    int64_t position_step = -2;
  };
  std::mutex mu;
  std::map<int, Outcome> by_rank;
  RunRankThreads(m.world, m.tp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(*spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    TrainingState& state = (*engine)->state();
    Outcome out;
    for (int64_t s = 0; s < kMaxSteps; ++s) {
      // bf16: the compute copy (the fp32 store's own copy is dropped) and the fp32 master.
      at::Tensor& live = state.bf16() ? state.params->flat_compute() : state.params->flat_params();
      const at::Tensor params = live.clone();
      const at::Tensor master = state.bf16() ? state.master.clone() : at::Tensor();
      absl::StatusOr<StepReport> r = (*engine)->RunWindow(LatchFor(*spec, s));
      ASSERT_TRUE(r.ok()) << "rank " << g.rank << " step " << s << ": " << r.status();
      if (!StepDiverged(*r)) continue;
      out.diverged = s;
      out.params_kept = at::equal(params, live);
      out.master_kept = !state.bf16() || at::equal(master, state.master);
      out.position_step = state.position.step;
      break;
    }
    std::lock_guard<std::mutex> lock(mu);
    by_rank[g.rank] = out;
  });
  ASSERT_EQ(by_rank.size(), static_cast<size_t>(m.world));
  const int64_t step = by_rank[0].diverged;
  ASSERT_GE(step, 1) << "step 0 runs the initial model: its loss is finite";
  for (const auto& [rank, out] : by_rank) {
    EXPECT_EQ(out.diverged, step) << "rank " << rank;
    EXPECT_TRUE(out.params_kept) << "rank " << rank << ": the update of step " << step;
    EXPECT_TRUE(out.master_kept) << "rank " << rank << ": the bf16 master of step " << step;
    EXPECT_EQ(out.position_step, step - 1) << "rank " << rank;
  }
  std::printf("%s: diverged at step %lld on every rank, not applied\n", m.name.c_str(),
              static_cast<long long>(step));
}

INSTANTIATE_TEST_SUITE_P(Modes, DivergeInProcess,
                         ::testing::Values(Mode{"tp2_zero0", 2, 2, 0}, Mode{"dp2_zero1", 2, 1, 1},
                                           Mode{"dp2_zero2", 2, 1, 2},
                                           Mode{"dp2tp2_zero0", 4, 2, 0},
                                           Mode{"dp2tp2_zero1_bf16", 4, 2, 1, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param.name;
                         });

// Standalone worker processes, TP 2, a checkpoint after every step.
TEST(DivergeWorkers, EveryRankExitsDivergedAfterTheLastGoodCheckpoint) {
  nlohmann::json spec = DivergingSpec(Mode{"tp2_zero0", 2, 2, 0});
  spec["latchkey"]["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 1}, {"keep", 100}};
  const WorkerRun run = RunWorkers(spec, 2);
  const std::regex said(
      "latchkey-worker: (loss|grad_norm) is (NaN|Inf|-Inf) at step ([0-9]+) "
      "\\(rank ([0-9])\\)\n");
  int64_t step = -1;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(run.exit_codes[r], kExitTrainingDiverged) << run.Describe();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.stderr_text[r], m, said)) << run.Describe();
    EXPECT_EQ(std::stoi(m[4]), r) << m[0];
    if (r == 0) step = std::stoll(m[3]);
    EXPECT_EQ(std::stoll(m[3]), step) << "rank " << r << ": " << m[0];
    EXPECT_EQ(run.stderr_text[r].find("terminate called"), std::string::npos) << run.Describe();
  }
  ASSERT_GE(step, 1) << run.Describe();
  for (int r = 0; r < 2; ++r) {
    const auto& records = run.steps[r];
    ASSERT_EQ(records.size(), static_cast<size_t>(step + 1)) << "rank " << r;
    for (int64_t s = 0; s < step; ++s) {
      EXPECT_TRUE(records[s]["loss"].is_number()) << records[s].dump();
      EXPECT_TRUE(records[s]["grad_norm"].is_number()) << records[s].dump();
    }
    const nlohmann::json& last = records.back();
    EXPECT_EQ(last["step"], step);
    EXPECT_TRUE(last["loss"].is_null() || last["grad_norm"].is_null()) << last.dump();
    EXPECT_FALSE(last.contains("checkpoint_seconds")) << last.dump();  // nothing saved for it
  }
  // Every good step's checkpoint committed (the last one at the diverged step's boundary), none
  // of the diverged step; the newest verifies.
  const std::string root = run.dir + "/ckpt";
  EXPECT_FALSE(fs::exists(root + "/" + CheckpointStepDirName(step))) << root;
  auto newest = NewestValidCheckpoint(root, CheckpointOwner());
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_TRUE(newest->has_value()) << root;
  EXPECT_EQ((*newest)->step, step - 1);
  auto verified = VerifyCheckpoint(root + "/" + CheckpointStepDirName(step - 1), "");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->step, step - 1);
}

}  // namespace
}  // namespace latchkey::testing
