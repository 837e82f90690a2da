#include "worker/train/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace latchkey {
namespace {

std::unique_ptr<FlatOps> Ops() { return *MakeFlatOps(c10::Device(c10::kCPU)); }

at::Tensor Vec(const std::vector<float>& v) {
  return at::tensor(at::ArrayRef<float>(v), at::kFloat).clone();
}

TEST(OptimizerTest, SgdUsesTheStepsLr) {
  auto ops = Ops();
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = 0.5;
  auto opt = MakeOptimizer(c, 2, ops.get());
  at::Tensor p = Vec({1.0f, -2.0f});
  const at::Tensor g = Vec({0.5f, 0.25f});
  opt->Step(p, g, 0.1);
  EXPECT_EQ(p[0].item<float>(), 1.0f - 0.1f * 0.5f);
  EXPECT_EQ(p[1].item<float>(), -2.0f - 0.1f * 0.25f);
  opt->Step(p, g, 0.0);  // lr 0: unchanged
  EXPECT_EQ(p[0].item<float>(), 1.0f - 0.1f * 0.5f);
}

// torch.optim.AdamW of one element, in float64, for steps with the given lrs and gradients.
double AdamWReference(double p, const std::vector<double>& grads, const std::vector<double>& lrs,
                      double wd) {
  double m = 0.0, v = 0.0;
  for (size_t t = 1; t <= lrs.size(); ++t) {
    const double lr = lrs[t - 1];
    const double g = grads[t - 1];
    p *= 1.0 - lr * wd;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double bc1 = 1.0 - std::pow(0.9, t), bc2 = 1.0 - std::pow(0.999, t);
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + 1e-8);
  }
  return p;
}

TEST(OptimizerTest, AdamWLrZeroStillAdvancesMomentsAndStepCount) {
  auto ops = Ops();
  OptimizerConfig c;  // AdamW, torch's defaults
  c.weight_decay = 0.1;
  auto opt = MakeOptimizer(c, 1, ops.get());
  at::Tensor p = Vec({0.75f});
  opt->Step(p, Vec({0.2f}), 0.0);
  EXPECT_EQ(p[0].item<float>(), 0.75f);  // no change at lr 0 ...
  opt->Step(p, Vec({-0.05f}), 0.01);     // ... but this is step t = 2 with m, v of both gradients
  const double want = AdamWReference(0.75, {0.2, -0.05}, {0.0, 0.01}, 0.1);
  EXPECT_NEAR(p[0].item<float>(), want, 1e-6);
  const double fresh = AdamWReference(0.75, {-0.05}, {0.01}, 0.1);
  EXPECT_GT(std::abs(want - fresh), 1e-5);  // the two differ measurably
}

TEST(OptimizerTest, AdamWFollowsAChangingLr) {
  auto ops = Ops();
  OptimizerConfig c;
  c.weight_decay = 0.01;
  auto opt = MakeOptimizer(c, 1, ops.get());
  at::Tensor p = Vec({-0.3f});
  const at::Tensor g = Vec({0.05f});
  const std::vector<double> lrs = {0.001, 0.004, 0.002};
  for (double lr : lrs) opt->Step(p, g, lr);
  EXPECT_NEAR(p[0].item<float>(), AdamWReference(-0.3, {0.05, 0.05, 0.05}, lrs, 0.01), 1e-6);
}

}  // namespace
}  // namespace latchkey
