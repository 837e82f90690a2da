// Uneven micro-batches per DP replica (latchkey.stragglers.rebalance; docs/fault-tolerance.md
// "Stragglers"): windows whose latch splits the n * DP micro-batches unevenly over the replicas
// give the losses, gradient norms and weights of the even split within float32 summation-order
// noise, on DP 2 x TP 1 and DP 2 x TP 2, with ZeRO 0, 1 (plain and overlapped) and 2, every K/V
// mode, clipping and dropout (whose masks follow the stream position, so the same samples get
// the same masks on whichever replica computes them). The K/V counts keep their mode: one per
// window coalesced, one per K/V tensor deferred, one per K/V tensor and micro-batch of the
// replica per micro-batch. Ranks are threads of this process (tests/support/rank_threads.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/latch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "worker/checkpoint/training_state.h"
#include "worker/model/param_store.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

constexpr int kWindows = 4;
constexpr int kGas = 2;  // n: each window has n * DP = 4 micro-batches
// Per window, the micro-batches of replicas 0 and 1: uneven both ways, even, and back.
const std::vector<std::vector<int>> kSplits = {{3, 1}, {1, 3}, {}, {3, 1}};
constexpr double kTolerance = 1e-5;  // relative: float32 summation order only

struct Case {
  int tp = 1;
  int zero = 0;
  std::string kv = "coalesced";
  double clip = 0.0;
  bool overlap = false;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "tp" + std::to_string(c.tp) + "_zero" + std::to_string(c.zero) + "_" + c.kv +
         (c.clip > 0 ? "_clip" : "") + (c.overlap ? "_overlap" : "");
}

JobSpec MakeSpec(const Case& c) {
  SpecParams p;  // synthetic data
  p.optimizer = "SGD";
  p.lr = 0.1;
  p.micro_batch = 2;
  p.gas = kGas;
  p.kv_reduce = c.kv;
  p.tp = c.tp;
  p.world_size = 2 * c.tp;
  p.clip = c.clip;
  p.steps = kWindows;
  p.seed = 5;
  p.zero_stage = c.zero;
  p.model["resid_pdrop"] = 0.1;
  p.model["attn_pdrop"] = 0.1;
  p.model["embd_pdrop"] = 0.1;
  nlohmann::json spec = SpecObject(p);
  spec["latchkey"]["stragglers"] = {{"rebalance", true}};
  if (c.overlap) spec["latchkey"]["overlap_dp_reduction"] = true;
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(spec.dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

struct Outcome {
  std::mutex mu;
  std::map<int, std::vector<StepReport>> reports;  // rank -> per window
  std::map<int, std::vector<float>> params;        // rank -> its final flat parameters
};

void RunJob(const JobSpec& spec, bool uneven, Outcome& out) {
  RunRankThreads(spec.world_size, spec.tp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int64_t s = 0; s < kWindows; ++s) {
      Latch l = DecideLatch(spec, InitialPolicy(spec), s, spec.FirstMicroBatch(s));
      if (uneven) l.replica_micro_batches = kSplits[static_cast<size_t>(s)];
      absl::StatusOr<StepReport> r = (*engine)->RunWindow(l);
      ASSERT_TRUE(r.ok()) << "rank " << g.rank << " window " << s << ": " << r.status();
      std::lock_guard<std::mutex> lock(out.mu);
      out.reports[g.rank].push_back(*r);
    }
    const at::Tensor flat = (*engine)->state().params->flat_params().contiguous();
    std::lock_guard<std::mutex> lock(out.mu);
    out.params[g.rank].assign(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  });
}

double Rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

class Rebalance : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(4); }
};

TEST_P(Rebalance, UnevenSplitsKeepTheNumbersAndTheKvCounts) {
  const Case& c = GetParam();
  const JobSpec spec = MakeSpec(c);
  Outcome even, uneven;
  RunJob(spec, false, even);
  RunJob(spec, true, uneven);
  ASSERT_EQ(even.reports.size(), static_cast<size_t>(spec.world_size));
  ASSERT_EQ(uneven.reports.size(), static_cast<size_t>(spec.world_size));
  double loss = 0.0, norm = 0.0, weight = 0.0;
  for (int r = 0; r < spec.world_size; ++r) {
    const int d = r / c.tp;
    ASSERT_EQ(uneven.reports[r].size(), static_cast<size_t>(kWindows));
    for (int s = 0; s < kWindows; ++s) {
      const StepReport& e = even.reports[r][s];
      const StepReport& u = uneven.reports[r][s];
      loss = std::max(loss, Rel(u.loss, e.loss));
      norm = std::max(norm, Rel(u.grad_norm, e.grad_norm));
      const std::vector<int>& split = kSplits[static_cast<size_t>(s)];
      const int count = split.empty() ? kGas : split[static_cast<size_t>(d)];
      EXPECT_EQ(u.micro_batches, kGas);
      EXPECT_EQ(u.replica_micro_batches, count) << "rank " << r << " window " << s;
      EXPECT_EQ(u.tokens, e.tokens);
      // The K/V reductions keep their mode's count: per window, or per micro-batch of this
      // replica.
      if (c.kv == "per_micro_batch") {
        EXPECT_EQ(u.kv_allreduce_calls * kGas, e.kv_allreduce_calls * count)
            << "rank " << r << " window " << s;
      } else {
        EXPECT_EQ(u.kv_allreduce_calls, e.kv_allreduce_calls) << "rank " << r << " window " << s;
      }
      if (c.kv == "coalesced" && c.tp > 1) {
        EXPECT_EQ(u.kv_allreduce_calls, 1);
      }
    }
    const std::vector<float>& pe = even.params[r];
    const std::vector<float>& pu = uneven.params[r];
    ASSERT_EQ(pe.size(), pu.size());
    double scale = 0.0;
    for (size_t i = 0; i < pe.size(); ++i) {
      weight = std::max(weight, std::abs(static_cast<double>(pu[i]) - pe[i]));
      scale = std::max(scale, std::abs(static_cast<double>(pe[i])));
    }
    weight /= std::max(scale, 1e-30);
  }
  std::printf("%s: max relative deviation loss %.2e grad_norm %.2e weights %.2e\n",
              Name({c, 0}).c_str(), loss, norm, weight);
  EXPECT_LE(loss, kTolerance);
  EXPECT_LE(norm, kTolerance);
  EXPECT_LE(weight, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Rebalance,
                         ::testing::Values(Case{1, 0, "per_micro_batch"}, Case{2, 0, "coalesced"},
                                           Case{2, 0, "deferred"}, Case{2, 0, "per_micro_batch"},
                                           Case{2, 1, "coalesced", 0.05},
                                           Case{2, 1, "deferred", 0.0, true},
                                           Case{2, 2, "coalesced"},
                                           Case{2, 2, "per_micro_batch", 0.05}),
                         Name);

// A latch whose split the engine cannot run is refused naming the field, before any compute.
TEST(RebalanceRefusal, ASplitThatDoesNotAddUpIsRefused) {
  const JobSpec spec = MakeSpec(Case{1, 0, "per_micro_batch"});
  RunRankThreads(2, 1, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Latch l = DecideLatch(spec, InitialPolicy(spec), 0, 0);
    l.replica_micro_batches = {3, 3};
    absl::StatusOr<StepReport> r = (*engine)->RunWindow(l);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(std::string(r.status().message()).find("replica_micro_batches"), std::string::npos)
        << r.status();
  });
}

}  // namespace
}  // namespace latchkey::testing
