// Accumulation windows, DP x TP, ZeRO 0/1, no_sync masks, exact clipping, bf16 and unmanaged
// windows, each against the unsharded single-process reference run of the same data.
//
// Reference trick (docs/data.md): sample k = ((M_s + m) * DP + d) * MB + b, so DP ranks
// with micro-batch MB see exactly the samples one rank with micro-batch DP * MB sees, and the
// window mean over all tokens is the same. DP 2 x MB 1 is therefore checked against DP 1 x MB 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tests/support/launch.h"
#include "tests/support/specs.h"
#include "tests/training/test_backend.h"
#include "worker/checkpoint/hf_checkpoint.h"

namespace latchkey::testing {
namespace {

double MaxLossDiff(const WorkerRun& ref, const WorkerRun& run) {
  double d = 0.0;
  for (size_t r = 0; r < run.steps.size(); ++r) {
    if (run.steps[r].size() != ref.steps[0].size()) return INFINITY;
    for (size_t s = 0; s < ref.steps[0].size(); ++s) {
      d = std::max(d, std::abs(ref.steps[0][s]["loss"].get<double>() -
                               run.steps[r][s]["loss"].get<double>()));
    }
  }
  return d;
}

double MaxRelNormDiff(const WorkerRun& ref, const WorkerRun& run) {
  double d = 0.0;
  for (size_t r = 0; r < run.steps.size(); ++r) {
    for (size_t s = 0; s < ref.steps[0].size(); ++s) {
      const double want = ref.steps[0][s]["grad_norm"].get<double>();
      d = std::max(d, std::abs(want - run.steps[r][s]["grad_norm"].get<double>()) / want);
    }
  }
  return d;
}

WorkerRun RunShaped(const RunShape& s, const nlohmann::json& extra_latchkey = {}) {
  nlohmann::json spec = FixtureSpec(s);
  for (auto it = extra_latchkey.begin(); it != extra_latchkey.end(); ++it) {
    spec["latchkey"][it.key()] = it.value();
  }
  return RunWorkers(spec, s.dp * s.tp, {"--save", "{dir}/final"});
}

// The unsharded reference of a DP x TP shape: one rank, MB * DP.
RunShape Reference(RunShape s) {
  s.mb *= s.dp;
  s.dp = 1;
  s.tp = 1;
  s.zero = 0;
  s.kv_reduce = "auto";
  return s;
}

struct DpCase {
  int zero;
  int gas;
  std::string kv;
};

class DpTpParity : public ::testing::TestWithParam<DpCase> {};

TEST_P(DpTpParity, Dp2Tp2MatchesUnsharded) {
  LATCHKEY_REQUIRE_TEST_BACKEND();
  const DpCase& c = GetParam();
  RunShape s = Dp2Tp2Shape();
  s.gas = c.gas;
  s.zero = c.zero;
  s.kv_reduce = c.kv;
  // lr 0.1: at lr 0.5 this model's SGD trajectory amplifies fp32 summation-order differences
  // about 4x per step (2e-7 relative in the step-0 grad norm, 1e-4 by step 5, in DP-only and
  // TP-only runs alike), which would test chaos rather than parity.
  s.lr = 0.1;
  WorkerRun ref = RunShaped(Reference(s));
  ASSERT_TRUE(ref.ok()) << ref.Describe();
  WorkerRun run = RunShaped(s);
  ASSERT_TRUE(run.ok()) << run.Describe();
  EXPECT_LE(MaxLossDiff(ref, run), 1e-5);
  EXPECT_LE(MaxRelNormDiff(ref, run), 1e-5);
  EXPECT_LE(MaxParamDiff(ref, run), 1e-5);
  const int64_t want_kv = c.kv == "per_micro_batch" ? 2 * 2 * c.gas : c.kv == "deferred" ? 4 : 1;
  for (const auto& rank : run.steps) {
    for (const auto& step : rank) {
      EXPECT_EQ(step["kv_allreduce_calls"].get<int64_t>(), want_kv);
      const auto& calls = step["collective_calls"];
      // Default mask: one DP reduction per window (ZeRO-0 all-reduce; ZeRO-1 reduce-scatter and
      // the parameter all-gather).
      if (c.zero == 0) {
        EXPECT_EQ(calls["all_reduce/dp"].get<int64_t>(), 1) << calls.dump();
      } else {
        EXPECT_EQ(calls["reduce_scatter/dp"].get<int64_t>(), 1) << calls.dump();
        EXPECT_EQ(calls["all_gather/dp"].get<int64_t>(), 1) << calls.dump();
      }
    }
  }
}

void PrintTo(const DpCase& c, std::ostream* os) {
  *os << "zero " << c.zero << " gas " << c.gas << " " << c.kv;
}

INSTANTIATE_TEST_SUITE_P(Windows, DpTpParity,
                         ::testing::Values(DpCase{0, 1, "per_micro_batch"},
                                           DpCase{0, 2, "deferred"}, DpCase{0, 4, "coalesced"},
                                           DpCase{0, 4, "per_micro_batch"},
                                           DpCase{1, 1, "coalesced"},
                                           DpCase{1, 2, "per_micro_batch"},
                                           DpCase{1, 4, "deferred"}, DpCase{1, 4, "coalesced"}),
                         [](const ::testing::TestParamInfo<DpCase>& i) {
                           return "zero" + std::to_string(i.param.zero) + "_gas" +
                                  std::to_string(i.param.gas) + "_" + i.param.kv;
                         });

// Any no_sync mask gives the same result; the count of DP reductions follows the mask.
TEST(NoSyncMasks, AnyMaskSameResult) {
  RunShape s = Dp2Tp2Shape();
  s.gas = 4;
  s.steps = 3;
  s.lr = 0.1;
  WorkerRun ref = RunShaped(Reference(s));
  ASSERT_TRUE(ref.ok()) << ref.Describe();
  for (int zero : {0, 1}) {
    for (const char* kv : {"per_micro_batch", "coalesced"}) {
      for (const std::vector<bool>& mask : {std::vector<bool>{false, false, false, false},
                                            std::vector<bool>{true, false, true, false},
                                            std::vector<bool>{false, true, true, false}}) {
        s.zero = zero;
        s.kv_reduce = kv;
        WorkerRun run = RunShaped(s, {{"no_sync", mask}});
        ASSERT_TRUE(run.ok()) << run.Describe();
        EXPECT_LE(MaxLossDiff(ref, run), 1e-5) << "zero " << zero << " " << kv;
        EXPECT_LE(MaxParamDiff(ref, run), 1e-5) << "zero " << zero << " " << kv;
        int64_t synced = 0;
        for (bool b : mask) synced += b ? 0 : 1;
        const auto& calls = run.steps[0][0]["collective_calls"];
        const int64_t dp_reductions = (zero == 0 ? calls["all_reduce/dp"].get<int64_t>()
                                                 : calls.value("all_reduce/dp", 0) +
                                                       calls["reduce_scatter/dp"].get<int64_t>());
        EXPECT_EQ(dp_reductions, synced) << calls.dump();
      }
    }
  }
}

// Clipping active every step (max norm far below the norm): SGD, where a wrong coefficient
// shows directly, and AdamW; at TP 2 and 4, DP 1 and 2.
TEST(Clipping, ClippedRunsMatchUnsharded) {
  for (const char* opt : {"SGD", "AdamW"}) {
    for (auto [dp, tp] : std::vector<std::pair<int, int>>{{1, 2}, {1, 4}, {2, 2}}) {
      RunShape s;
      s.optimizer = opt;
      // AdamW normalises every update to about lr, whatever the gradient's size, so rounding in
      // near-zero gradient entries moves parameters by O(lr): a small lr keeps that below 1e-5.
      s.lr = std::string(opt) == "SGD" ? 0.5 : 0.001;
      s.clip = 0.05;
      s.mb = 1;
      s.dp = dp;
      s.tp = tp;
      s.gas = 2;
      s.steps = 4;
      s.kv_reduce = "coalesced";
      s.zero = dp > 1 ? 1 : 0;
      WorkerRun ref = RunShaped(Reference(s));
      ASSERT_TRUE(ref.ok()) << ref.Describe();
      WorkerRun run = RunShaped(s);
      ASSERT_TRUE(run.ok()) << run.Describe();
      for (const auto& step : ref.steps[0]) ASSERT_GT(step["grad_norm"].get<double>(), 0.05);
      EXPECT_LE(MaxLossDiff(ref, run), 1e-5) << opt << " dp " << dp << " tp " << tp;
      EXPECT_LE(MaxRelNormDiff(ref, run), 1e-5) << opt << " dp " << dp << " tp " << tp;
      if (std::string(opt) == "SGD") {
        EXPECT_LE(MaxParamDiff(ref, run), 1e-5) << opt << " dp " << dp << " tp " << tp;
      } else {
        // AdamW's update m / (sqrt(v) + eps) has size ~lr even where the gradient is at rounding
        // level, so summation-order rounding in such entries moves them by a fraction of lr
        // (measured ~1.2e-5 at lr 1e-3): the weights are held to 5% of the total step size,
        // the losses and norms above to 1e-5.
        EXPECT_LE(MaxParamDiff(ref, run), 0.05 * s.lr * s.steps) << opt << " dp " << dp;
      }
    }
  }
}

// After clipping the SGD update is exactly max/(norm + 1e-6) times the unclipped one.
TEST(Clipping, UpdateIsScaledByTheClipCoefficient) {
  RunShape s;
  s.tp = 2;
  s.steps = 1;
  s.kv_reduce = "coalesced";
  WorkerRun plain = RunShaped(s);
  s.clip = 0.1;
  WorkerRun clipped = RunShaped(s);
  ASSERT_TRUE(plain.ok() && clipped.ok()) << plain.Describe() << clipped.Describe();
  const double norm = clipped.steps[0][0]["grad_norm"].get<double>();
  const double coef = 0.1 / (norm + 1e-6);
  ASSERT_LT(coef, 1.0);
  auto init = ReadHfCheckpoint(FixtureDir() + "/mqa");
  auto a = ReadSafetensorsFile(plain.dir + "/final/model.safetensors");
  auto b = ReadSafetensorsFile(clipped.dir + "/final/model.safetensors");
  ASSERT_TRUE(init.ok() && a.ok() && b.ok());
  double max_err = 0.0, max_update = 0.0;
  for (const StTensor& t : init->weights.tensors) {
    const auto p0 = TensorValues(t), pa = TensorValues(*a->Find(t.name)),
               pb = TensorValues(*b->Find(t.name));
    for (size_t i = 0; i < p0.size(); ++i) {
      max_err = std::max(max_err, std::abs((pb[i] - p0[i]) - coef * (pa[i] - p0[i])));
      max_update = std::max(max_update, std::abs(pa[i] - p0[i]));
    }
  }
  EXPECT_GT(max_update, 1e-3);
  EXPECT_LE(max_err, 1e-6);
}

// ZeRO-1 holds AdamW state (and, under bf16, the fp32 master weights) only for this rank's
// partition: about 1/DP of stage 0's bytes.
TEST(Zero1, OptimizerStateIsPartitioned) {
  for (bool bf16 : {false, true}) {
    RunShape s = Dp2Tp2Shape();
    s.optimizer = "AdamW";
    s.lr = 0.001;
    s.steps = 2;
    auto run = [&](int zero) {
      s.zero = zero;
      nlohmann::json spec = FixtureSpec(s);
      spec["bf16"] = {{"enabled", bf16}};
      return RunWorkers(spec, 4, {"--save", "{dir}/final"});
    };
    WorkerRun z0 = run(0);
    WorkerRun z1 = run(1);
    ASSERT_TRUE(z0.ok() && z1.ok()) << z0.Describe() << z1.Describe();
    for (int r = 0; r < 4; ++r) {
      const double b0 = z0.steps[r][0]["optimizer_state_bytes"].get<double>();
      const double b1 = z1.steps[r][0]["optimizer_state_bytes"].get<double>();
      EXPECT_GT(b0, 0);
      EXPECT_NEAR(b1 / b0, 0.5, 0.01) << "rank " << r << " bf16 " << bf16;
    }
    // Partitioning changes where state lives, not the numbers.
    for (size_t st = 0; st < 2; ++st) {
      EXPECT_NEAR(z0.steps[0][st]["loss"].get<double>(), z1.steps[0][st]["loss"].get<double>(),
                  bf16 ? 1e-3 : 1e-5);
    }
    EXPECT_LE(MaxParamDiff(z0, z1), bf16 ? 1e-3 : 1e-5) << "bf16 " << bf16;
  }
}

// The gradient files of every rank of a run that passed --dump-grads {dir}/grads.
std::vector<StFile> DumpedGrads(const WorkerRun& run) {
  std::vector<StFile> out;
  for (size_t r = 0; r < run.steps.size(); ++r) {
    auto f =
        ReadSafetensorsFile(run.dir + "/grads/grads-rank" + std::to_string(r) + ".safetensors");
    EXPECT_TRUE(f.ok()) << f.status();
    out.push_back(f.ok() ? *std::move(f) : StFile{});
  }
  return out;
}

// Largest absolute difference between two dumps of the same shard layout (INFINITY when a
// tensor is missing or differs in size).
double MaxGradDiff(const StFile& a, const StFile& b) {
  if (a.tensors.size() != b.tensors.size() || a.tensors.empty()) return INFINITY;
  double d = 0.0;
  for (const StTensor& t : a.tensors) {
    const StTensor* u = b.Find(t.name);
    if (u == nullptr || u->shape != t.shape) return INFINITY;
    const auto x = TensorValues(t), y = TensorValues(*u);
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  }
  return d;
}

// --dump-grads under ZeRO-1 with DP > 1: a rank reduces only its own partition (the in-place
// reduce-scatter uses the rest of its buffer as scratch), yet every rank's file must hold its
// TP shard's whole window-mean gradient: the one the ZeRO-0 run of the same job dumps (same
// reduction, so to rounding), and at TP 1 the unsharded run's (to summation order).
TEST(Zero1, DumpedGradientsAreTheWholeReducedGradient) {
  for (auto [dp, tp] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}}) {
    RunShape s;
    s.mb = 1;
    s.dp = dp;
    s.tp = tp;
    s.gas = 2;
    s.steps = 2;
    s.lr = 0.1;
    s.kv_reduce = "coalesced";
    auto run = [](const RunShape& shape) {
      return RunWorkers(FixtureSpec(shape), shape.dp * shape.tp,
                        {"--dump-grads", "{dir}/grads", "--dump-grads-step", "1"});
    };
    s.zero = 0;
    WorkerRun z0 = run(s);
    s.zero = 1;
    WorkerRun z1 = run(s);
    ASSERT_TRUE(z0.ok() && z1.ok()) << z0.Describe() << z1.Describe();
    const std::vector<StFile> g0 = DumpedGrads(z0), g1 = DumpedGrads(z1);
    for (int r = 0; r < dp * tp; ++r) {
      EXPECT_LE(MaxGradDiff(g0[r], g1[r]), 1e-7) << "dp " << dp << " tp " << tp << " rank " << r;
      // The dump's gather is observed like every collective: one all-gather more in its window.
      EXPECT_EQ(z1.steps[r][1]["collective_calls"]["all_gather/dp"].get<int64_t>(), 2);
      EXPECT_EQ(z1.steps[r][0]["collective_calls"]["all_gather/dp"].get<int64_t>(), 1);
    }
    if (tp == 1) {
      WorkerRun ref = run(Reference(s));
      ASSERT_TRUE(ref.ok()) << ref.Describe();
      const StFile unsharded = DumpedGrads(ref)[0];
      for (int r = 0; r < dp; ++r) EXPECT_LE(MaxGradDiff(unsharded, g1[r]), 1e-5) << "rank " << r;
    }
  }
}

// Caller-owned windows: a 1,2,4 schedule (the last repeating) at TP 2 trains exactly like the
// unsharded reference on the same windows (M_s = 0,1,3,7,11).
TEST(UnmanagedWindows, ScheduleMatchesUnsharded) {
  RunShape s;
  s.tp = 2;
  s.steps = 5;
  s.kv_reduce = "deferred";
  auto with_schedule = [](const RunShape& shape) {
    nlohmann::json spec = FixtureSpec(shape);
    spec["managed_gradient_accumulation"] = false;
    spec["latchkey"]["window_schedule"] = {1, 2, 4};
    return RunWorkers(spec, shape.dp * shape.tp, {"--save", "{dir}/final"});
  };
  WorkerRun ref = with_schedule(Reference(s));
  WorkerRun run = with_schedule(s);
  ASSERT_TRUE(ref.ok() && run.ok()) << ref.Describe() << run.Describe();
  const std::vector<int> n = {1, 2, 4, 4, 4};
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(run.steps[0][step]["micro_batches"].get<int>(), n[step]);
    EXPECT_EQ(run.steps[0][step]["kv_allreduce_calls"].get<int>(), 4);  // deferred: 2 * L
  }
  EXPECT_LE(MaxLossDiff(ref, run), 1e-5);
  EXPECT_LE(MaxParamDiff(ref, run), 1e-5);
}

// bf16 compute with fp32 master weights: losses within 1.5e-3 relative of fp32 over 6 steps (the
// measured gap is at most 5.7e-4; an untrained run is 2.6e-3 away), and the saved (master) weights
// are F32. Negative control: the same bf16 job that does not train (lr 1e-12: the spec refuses 0)
// is further than that from the fp32 run, so the bound tells training from no training.
TEST(Bf16, TracksFp32AndKeepsFp32Master) {
  RunShape s;
  s.tp = 2;
  s.gas = 2;
  s.optimizer = "AdamW";
  s.lr = 0.003;
  s.kv_reduce = "coalesced";
  WorkerRun fp32 = RunShaped(s);
  nlohmann::json spec = FixtureSpec(s);
  spec["bf16"] = {{"enabled", true}};
  WorkerRun bf16 = RunWorkers(spec, 2, {"--save", "{dir}/final"});
  spec["optimizer"]["params"]["lr"] = 1e-12;
  WorkerRun untrained = RunWorkers(spec, 2);
  ASSERT_TRUE(fp32.ok() && bf16.ok() && untrained.ok())
      << fp32.Describe() << bf16.Describe() << untrained.Describe();
  constexpr double kTol = 1.5e-3;
  double gap = 0.0, control = 0.0;
  for (size_t st = 0; st < 6; ++st) {
    const double a = fp32.steps[0][st]["loss"].get<double>();
    const double b = bf16.steps[0][st]["loss"].get<double>();
    const double u = untrained.steps[0][st]["loss"].get<double>();
    EXPECT_LE(std::abs(a - b) / a, kTol) << "step " << st;
    gap = std::max(gap, std::abs(a - b) / a);
    control = std::max(control, std::abs(a - u) / a);
  }
  std::printf("bf16 vs fp32: max relative loss gap %.3g; untrained bf16 vs fp32: %.3g\n", gap,
              control);
  EXPECT_GT(control, kTol) << "an untrained run would pass the bound";
  auto saved = ReadSafetensorsFile(bf16.dir + "/final/model.safetensors");
  ASSERT_TRUE(saved.ok());
  for (const StTensor& t : saved->tensors) EXPECT_EQ(t.dtype, StDtype::kF32) << t.name;
  // The master moved by the fp32 updates, not by bf16 rounding alone.
  EXPECT_GT(MaxParamDiff(fp32, bf16), 0.0);
}

// bf16's resolution at w: half the spacing of bf16 values around |w| (8 significant bits).
double HalfBf16Ulp(double w) {
  int exp = 0;
  std::frexp(std::abs(w), &exp);  // |w| = f * 2^exp, f in [0.5, 1)
  return std::ldexp(1.0, exp - 8) / 2;
}

// What the fp32 master is for: SGD updates smaller than bf16's resolution of the weights
// (lr * grad below half a bf16 ulp, every step) accumulate in the master and show in the saved
// weights, which move by about steps * lr * grad, as in the fp32 run of the same job. Weights
// held in bf16 alone would round every such update away and never move.
TEST(Bf16, MasterAccumulatesUpdatesBelowBf16Resolution) {
  for (auto [dp, tp] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}}) {
    RunShape s;
    s.dp = dp;
    s.tp = tp;
    s.mb = 1;
    s.gas = 2;
    s.steps = 6;
    s.lr = 1e-3;
    s.zero = dp > 1 ? 1 : 0;  // ZeRO-1 keeps the master only for the rank's partition
    s.kv_reduce = "coalesced";
    WorkerRun fp32 = RunShaped(s);
    nlohmann::json spec = FixtureSpec(s);
    spec["bf16"] = {{"enabled", true}};
    WorkerRun bf16 = RunWorkers(spec, dp * tp, {"--save", "{dir}/final"});
    ASSERT_TRUE(fp32.ok() && bf16.ok()) << fp32.Describe() << bf16.Describe();
    auto init = ReadHfCheckpoint(FixtureDir() + "/mqa");
    auto a = ReadSafetensorsFile(fp32.dir + "/final/model.safetensors");
    auto b = ReadSafetensorsFile(bf16.dir + "/final/model.safetensors");
    ASSERT_TRUE(init.ok() && a.ok() && b.ok());
    // Over the weights whose updates are below bf16's resolution (the fp32 run's mean update
    // per step under half of half an ulp: a margin for steps larger than the mean): how far the
    // bf16 run's total movement is from the fp32 run's.
    int64_t total = 0, below = 0;
    double update_sq = 0.0, err_sq = 0.0;
    for (const StTensor& t : init->weights.tensors) {
      const auto p0 = TensorValues(t), pa = TensorValues(*a->Find(t.name)),
                 pb = TensorValues(*b->Find(t.name));
      for (size_t i = 0; i < p0.size(); ++i) {
        ++total;
        const double update = pa[i] - p0[i];
        if (p0[i] == 0.0 || std::abs(update) / s.steps >= HalfBf16Ulp(p0[i]) / 2) continue;
        ++below;
        update_sq += update * update;
        const double moved = pb[i] - p0[i];
        err_sq += (moved - update) * (moved - update);
      }
    }
    // The premise: nearly every weight gets updates below bf16's resolution, and they add up.
    ASSERT_GE(below, total * 9 / 10) << "lr too large for this test";
    ASSERT_GT(std::sqrt(update_sq / below), 1e-6);
    // bf16 compute changes the gradients by about a percent; without the master the bf16 run's
    // weights would not have moved, an error of 100% of the update.
    EXPECT_LE(std::sqrt(err_sq / update_sq), 0.1) << "dp " << dp << " tp " << tp;
  }
}

}  // namespace
}  // namespace latchkey::testing
