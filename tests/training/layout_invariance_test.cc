// Dropout does not depend on the layout (docs/model.md, "Dropout and the RNG rule"): the same
// spec with dropout 0.1 on the embeddings, the residuals and the attention probabilities, run as
// TP 1, 2 and 4, and as DP 2 x TP 2 against DP 1 x TP 2 with gradient accumulation doubled (the
// same global batch), gives the same per-step losses and gradient norms within 1e-5 relative.
// Controls: dropout really changes the loss, and a second pass over the data draws new masks
// (masks that ignored the stream position, or wrapped it modulo the data size, would repeat).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/specs.h"

namespace latchkey::testing {
namespace {

constexpr double kDropout = 0.1;
constexpr double kTolerance = 1e-5;

nlohmann::json WithDropout(nlohmann::json spec, double p) {
  spec["model"]["embd_pdrop"] = p;
  spec["model"]["resid_pdrop"] = p;
  spec["model"]["attn_pdrop"] = p;
  return spec;
}

// The fixture model with SGD (lr 0.1) on the fixture tokens; 4 samples per step (dp · gas · mb).
RunShape Shape(int dp, int tp, int gas) {
  RunShape s;
  s.mb = 2;
  s.dp = dp;
  s.tp = tp;
  s.gas = gas;
  s.steps = 6;
  s.lr = 0.1;  // the fixture's 0.5 amplifies fp32 summation-order noise step by step
  return s;
}

WorkerRun RunLayout(const nlohmann::json& spec, int world) {
  WorkerRun w = RunWorkers(spec, world);
  EXPECT_TRUE(w.ok()) << w.Describe();
  return w;
}

double Field(const WorkerRun& w, size_t step, const char* key) {
  return w.steps[0].at(step)[key].get<double>();
}

double Relative(double a, double ref) { return std::abs(a - ref) / std::abs(ref); }

struct Deviation {
  double loss = 0.0;
  double grad_norm = 0.0;
};

// The largest relative deviation of every step's loss and grad norm (every rank's record).
Deviation Compare(const WorkerRun& ref, const WorkerRun& run) {
  Deviation d;
  for (size_t r = 0; r < run.steps.size(); ++r) {
    EXPECT_EQ(run.steps[r].size(), ref.steps[0].size()) << "rank " << r;
    for (size_t s = 0; s < std::min(run.steps[r].size(), ref.steps[0].size()); ++s) {
      d.loss =
          std::max(d.loss, Relative(run.steps[r][s]["loss"].get<double>(), Field(ref, s, "loss")));
      d.grad_norm = std::max(d.grad_norm, Relative(run.steps[r][s]["grad_norm"].get<double>(),
                                                   Field(ref, s, "grad_norm")));
    }
  }
  return d;
}

TEST(LayoutInvariance, DropoutLossesAgreeAcrossTpAndDp) {
  const WorkerRun ref = RunLayout(WithDropout(FixtureSpec(Shape(1, 1, 2)), kDropout), 1);
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ref.steps[0].size(), 6u);
  struct Layout {
    const char* name;
    int dp, tp, gas;
  };
  const Layout layouts[] = {
      {"DP1 x TP2, GAS 2", 1, 2, 2}, {"DP1 x TP4, GAS 2", 1, 4, 2}, {"DP2 x TP2, GAS 1", 2, 2, 1}};
  std::vector<WorkerRun> runs;
  for (const Layout& l : layouts) {
    runs.push_back(
        RunLayout(WithDropout(FixtureSpec(Shape(l.dp, l.tp, l.gas)), kDropout), l.dp * l.tp));
    ASSERT_TRUE(runs.back().ok()) << l.name;
  }
  std::printf("dropout %.1f (embd, resid, attn), 6 steps, 4 samples per step\n", kDropout);
  std::printf("%-40s %-18s %-18s\n", "layout", "max rel loss dev", "max rel gnorm dev");
  const auto row = [](const std::string& name, const Deviation& d) {
    std::printf("%-40s %-18.3g %-18.3g\n", name.c_str(), d.loss, d.grad_norm);
    EXPECT_LE(d.loss, kTolerance) << name;
    EXPECT_LE(d.grad_norm, kTolerance) << name;
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    row(std::string(layouts[i].name) + " vs DP1 x TP1, GAS 2", Compare(ref, runs[i]));
  }
  // DP 2 against DP 1 with gradient accumulation doubled, at TP 2.
  row("DP2 x TP2, GAS 1 vs DP1 x TP2, GAS 2", Compare(runs[0], runs[2]));
  // The control: dropout is active, its effect far above the tolerance (without it the
  // comparison above would only be the TP parity test).
  const WorkerRun plain = RunLayout(FixtureSpec(Shape(1, 1, 2)), 1);
  ASSERT_TRUE(plain.ok());
  const double loss_effect = Relative(Field(ref, 0, "loss"), Field(plain, 0, "loss"));
  const double norm_effect = Relative(Field(ref, 0, "grad_norm"), Field(plain, 0, "grad_norm"));
  std::printf("dropout 0 vs %.1f at TP1, step 0: rel loss difference %.3g, gnorm %.3g\n", kDropout,
              loss_effect, norm_effect);
  EXPECT_GT(loss_effect, 10 * kTolerance);
  EXPECT_GT(norm_effect, 1e-2);
}

// A token file of exactly `samples` samples of seq_len 32: the first tokens of the fixture's.
std::string SmallTokenFile(int samples) {
  std::ifstream in(FixtureDir() + "/tokens.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t tokens = static_cast<size_t>(samples) * 32 + 1;
  EXPECT_GE(bytes.size(), tokens * 2);
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("layout-invariance-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tokens.bin").string();
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(tokens * 2));
  return path;
}

// With 4 samples and 4 samples per step every step reads the same data, and with a negligible
// learning rate the same weights: without dropout the losses repeat, with dropout every pass
// (the stream positions 4s..4s+3, not wrapped) draws new masks, at TP1 and TP2 alike.
TEST(LayoutInvariance, SecondEpochDrawsNewMasks) {
  const std::string tokens = SmallTokenFile(4);
  for (int tp : {1, 2}) {
    RunShape s = Shape(1, tp, 2);
    s.lr = 1e-9;
    nlohmann::json spec = FixtureSpec(s);
    spec["latchkey"]["data"] = TokensData(tokens);
    const WorkerRun plain = RunLayout(spec, tp);
    const WorkerRun drop = RunLayout(WithDropout(spec, kDropout), tp);
    ASSERT_TRUE(plain.ok() && drop.ok());
    double plain_dev = 0.0;
    double drop_min = INFINITY;
    for (size_t step = 1; step < 6; ++step) {
      plain_dev =
          std::max(plain_dev, Relative(Field(plain, step, "loss"), Field(plain, 0, "loss")));
      drop_min = std::min(drop_min, Relative(Field(drop, step, "loss"), Field(drop, 0, "loss")));
    }
    std::printf(
        "tp %d, steps 1-5 vs step 0 (same samples): dropout 0 max rel dev %.3g, "
        "dropout %.1f min rel dev %.3g\n",
        tp, plain_dev, kDropout, drop_min);
    EXPECT_LE(plain_dev, 1e-6) << "tp " << tp << ": the data does not repeat";
    EXPECT_GT(drop_min, 1e-4) << "tp " << tp << ": a pass over the data repeated its masks";
  }
  std::filesystem::remove_all(std::filesystem::path(tokens).parent_path());
}

}  // namespace
}  // namespace latchkey::testing
