// Each GradSync strategy on DP 2 (ranks as threads on shm, the fixture's model): the DP
// collectives of a window follow its strategy and its no_sync mask, every strategy hands back
// the same mean gradient partition, norm and loss, and one object runs windows of different
// micro-batch counts, each counted from its own latch.
#include "worker/train/grad_sync.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/latch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scripted_group.h"
#include "tests/support/specs.h"
#include "worker/checkpoint/training_state.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"

namespace latchkey {
namespace {

constexpr int kDp = 2;

JobSpec Dp2Spec() {
  testing::RunShape r;  // SGD on the fixture's model
  r.mb = 1;
  r.dp = kDp;
  testing::SpecParams p = testing::FixtureParams(r);
  p.seq_len = 8;
  p.init_from.clear();  // seeded weights
  auto spec = ParseJobSpec(testing::SpecJson(p), "/");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

Latch Window(int n, std::vector<bool> no_sync) {
  Latch l;
  l.n = n;
  l.no_sync = std::move(no_sync);
  l.kv_mode = KvMode::kPerMicroBatch;
  return l;
}

struct Outcome {
  std::vector<std::map<std::string, int64_t>> calls;  // per window: DP / world collectives
  std::vector<double> partition;                      // of the last window
  double norm_sq = 0.0;
  double loss = 0.0;
};

// Runs `windows` through the strategy `plan` names on this rank, as the engine does: the
// strategy's store, a backward of loss / n per micro-batch, Finish with this rank's loss
// (dp_rank + 1).
Outcome RunWindows(comm::ProcessGroups& g, const JobSpec& spec, const GradSyncPlan& plan,
                   const std::vector<Latch>& windows) {
  Outcome out;
  auto layout = BuildTpLayout(spec.model, g.tp, g.tp_rank);
  EXPECT_TRUE(layout.ok()) << layout.status();
  ParamStore store(*std::move(layout), plan.partitioned() ? g.dp : 1, c10::Device(c10::kCPU),
                   /*attach_grads=*/plan.kind != GradSyncKind::kPartition);
  EXPECT_TRUE(store.LoadFromFull(InitFullWeights(spec.model, spec.seed), g.tp_rank).ok());
  GptBigCode model(spec.model, &store, g.tp_group.get(), spec.seed, false);
  auto ops = MakeFlatOps(c10::Device(c10::kCPU));
  EXPECT_TRUE(ops.ok()) << ops.status();
  TrainingState state;
  state.zero1 = plan.partitioned();
  const int64_t chunk = state.zero1 ? store.padded_numel() / g.dp : store.numel();
  state.part_begin = state.zero1 ? g.dp_rank * chunk : 0;
  state.part_end = state.part_begin + chunk;
  GradSyncEnv env;
  env.spec = &spec;
  env.groups = &g;
  env.store = &store;
  env.ops = ops->get();
  env.state = &state;
  std::unique_ptr<GradSync> sync = MakeGradSync(plan, env);
  const int S = spec.seq_len;
  for (const Latch& latch : windows) {
    const auto before = g.stats->Snapshot();
    sync->BeginWindow(latch);
    for (int m = 0; m < latch.n; ++m) {
      at::Tensor tokens = at::empty({1, S + 1}, at::kLong);
      for (int i = 0; i <= S; ++i) {
        tokens[0][i] = (7 * i + 13 * m + 31 * g.dp_rank) % spec.model.vocab_size;
      }
      sync->BeforeBackward(m);
      at::Tensor loss = model.Loss(tokens.narrow(1, 0, S), tokens.narrow(1, 1, S),
                                   {static_cast<int64_t>(m * g.dp + g.dp_rank)});
      (loss / static_cast<double>(latch.n)).backward();
      EXPECT_TRUE(sync->AfterBackward(m).ok());
    }
    auto result = sync->Finish(g.dp_rank + 1.0);
    EXPECT_TRUE(result.ok()) << result.status();
    out.norm_sq = result->norm_sq;
    out.loss = result->loss;
    std::map<std::string, int64_t> calls;
    for (const auto& [key, c] : comm::CollectiveStats::Delta(g.stats->Snapshot(), before)) {
      calls[key] = c.calls;
    }
    out.calls.push_back(calls);
  }
  const at::Tensor part = sync->partition().contiguous();
  out.partition.assign(part.data_ptr<float>(), part.data_ptr<float>() + part.numel());
  return out;
}

// Every rank's outcome, by DP rank.
std::vector<Outcome> RunOnDp2(const GradSyncPlan& plan, const std::vector<Latch>& windows) {
  const JobSpec spec = Dp2Spec();
  std::vector<Outcome> outs(kDp);
  std::mutex mu;
  testing::RunRankThreads(kDp, 1, [&](comm::ProcessGroups& g) {
    Outcome o = RunWindows(g, spec, plan, windows);
    std::lock_guard<std::mutex> lock(mu);
    outs[g.dp_rank] = std::move(o);
  });
  return outs;
}

GradSyncPlan Plan(GradSyncKind kind, bool overlap = false) {
  GradSyncPlan p;
  p.kind = kind;
  p.overlap = overlap;
  return p;
}

int64_t Calls(const std::map<std::string, int64_t>& calls, const std::string& key) {
  auto it = calls.find(key);
  return it == calls.end() ? 0 : it->second;
}

// Three micro-batches, the first no_sync: one synchronised micro-batch before the last.
const std::vector<Latch>& MixedWindow() {
  static const std::vector<Latch> w = {Window(3, {true, false, false})};
  return w;
}

TEST(GradSyncPlanTest, PicksTheStrategyFromTheSpec) {
  JobSpec spec = Dp2Spec();
  comm::ProcessGroups g;
  g.stats = std::make_shared<comm::CollectiveStats>();
  g.dp_group = std::make_shared<comm::SingleRankGroup>("dp", comm::Device::Cpu(), g.stats);
  spec.zero_stage = 2;
  EXPECT_EQ(PlanGradSync(spec, g, true).kind, GradSyncKind::kMeanAllReduce);  // DP 1
  g.dp_group = std::make_shared<testing::ScriptedGroup>("dp", 0, 2, g.stats);
  EXPECT_EQ(PlanGradSync(spec, g, true).kind, GradSyncKind::kPartition);
  EXPECT_FALSE(PlanGradSync(spec, g, true).overlap);
  spec.zero_stage = 1;
  EXPECT_EQ(PlanGradSync(spec, g, false).kind, GradSyncKind::kReduceScatter);
  EXPECT_FALSE(PlanGradSync(spec, g, false).overlap);
  EXPECT_TRUE(PlanGradSync(spec, g, true).overlap);
  spec.overlap_dp_reduction = true;
  EXPECT_TRUE(PlanGradSync(spec, g, false).overlap);
  spec.overlap_dp_reduction = false;
  spec.zero_stage = 0;
  EXPECT_EQ(PlanGradSync(spec, g, false).kind, GradSyncKind::kMeanAllReduce);
}

TEST(GradSyncTest, CollectivesPerWindowFollowTheStrategy) {
  const auto mean = RunOnDp2(Plan(GradSyncKind::kMeanAllReduce), MixedWindow());
  const auto rs = RunOnDp2(Plan(GradSyncKind::kReduceScatter), MixedWindow());
  const auto ov = RunOnDp2(Plan(GradSyncKind::kReduceScatter, true), MixedWindow());
  const auto part = RunOnDp2(Plan(GradSyncKind::kPartition), MixedWindow());
  const int64_t buckets = Calls(ov[0].calls[0], "reduce_scatter/dp");
  EXPECT_GT(buckets, 2);
  for (int r = 0; r < kDp; ++r) {
    // ZeRO-0: the mean after micro-batch 1, the boundary's (the loss in its spare slot).
    EXPECT_EQ(Calls(mean[r].calls[0], "all_reduce/dp"), 2);
    EXPECT_EQ(Calls(mean[r].calls[0], "reduce_scatter/dp"), 0);
    EXPECT_EQ(Calls(mean[r].calls[0], "all_reduce/world"), 0);
    // ZeRO-1: the same mean, one whole-buffer reduce-scatter or one per bucket, the norm's sum.
    EXPECT_EQ(Calls(rs[r].calls[0], "all_reduce/dp"), 1);
    EXPECT_EQ(Calls(rs[r].calls[0], "reduce_scatter/dp"), 1);
    EXPECT_EQ(Calls(rs[r].calls[0], "all_reduce/world"), 1);
    EXPECT_EQ(Calls(ov[r].calls[0], "all_reduce/dp"), 1);
    EXPECT_EQ(Calls(ov[r].calls[0], "reduce_scatter/dp"), buckets);
    EXPECT_EQ(Calls(ov[r].calls[0], "all_reduce/world"), 1);
    // ZeRO-2: the buckets of each of the two synchronised micro-batches, no all-reduce over DP.
    EXPECT_EQ(Calls(part[r].calls[0], "all_reduce/dp"), 0);
    EXPECT_EQ(Calls(part[r].calls[0], "reduce_scatter/dp"), 2 * buckets);
    EXPECT_EQ(Calls(part[r].calls[0], "all_reduce/world"), 1);
    for (const auto* o : {&mean, &rs, &ov, &part}) {
      EXPECT_DOUBLE_EQ((*o)[r].loss, 1.5);  // the mean over DP of the ranks' losses
      EXPECT_NEAR((*o)[r].norm_sq, mean[0].norm_sq, 1e-6 * mean[0].norm_sq);
    }
    // The bucketed reduce-scatter is the whole-buffer one, bit for bit; ZeRO-2 sums the two
    // synchronised micro-batches' DP sums instead of averaging the accumulated buffer.
    EXPECT_EQ(rs[r].partition, ov[r].partition);
    ASSERT_EQ(rs[r].partition.size(), part[r].partition.size());
    const int64_t begin = r * static_cast<int64_t>(rs[r].partition.size());
    for (size_t i = 0; i < rs[r].partition.size(); ++i) {
      const size_t flat = begin + i;
      const double whole = flat < mean[r].partition.size() ? mean[r].partition[flat] : 0.0;
      ASSERT_NEAR(rs[r].partition[i], whole, 1e-6) << "rank " << r << " element " << i;
      ASSERT_NEAR(part[r].partition[i], whole, 1e-6) << "rank " << r << " element " << i;
    }
  }
}

// One object, windows of 1 and 4 micro-batches (all synchronised in the second): each window's
// collectives follow its own count.
TEST(GradSyncTest, EachWindowCountsItsOwnMicroBatches) {
  const std::vector<Latch> windows = {Window(1, {false}), Window(4, {false, false, false, false})};
  const auto mean = RunOnDp2(Plan(GradSyncKind::kMeanAllReduce), windows);
  const auto part = RunOnDp2(Plan(GradSyncKind::kPartition), windows);
  for (int r = 0; r < kDp; ++r) {
    EXPECT_EQ(Calls(mean[r].calls[0], "all_reduce/dp"), 1);
    EXPECT_EQ(Calls(mean[r].calls[1], "all_reduce/dp"), 4);
    const int64_t buckets = Calls(part[r].calls[0], "reduce_scatter/dp");
    EXPECT_GT(buckets, 2);
    EXPECT_EQ(Calls(part[r].calls[1], "reduce_scatter/dp"), 4 * buckets);
  }
}

}  // namespace
}  // namespace latchkey
