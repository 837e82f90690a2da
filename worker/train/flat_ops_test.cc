// The CPU FlatOps against the formulas of their contract.
#include "worker/train/flat_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>

#include "worker/train/grad_norm.h"

namespace latchkey {
namespace {

std::unique_ptr<FlatOps> Cpu() { return *MakeFlatOps(c10::Device(c10::kCPU)); }

at::Tensor Randn(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({n}, gen);
}

// cuda's kernels depend on the libtorch linked (flat_ops_device_test.cc); any other device has
// none.
TEST(FlatOps, CpuHasKernelsAndOtherDevicesAreRefusedByName) {
  EXPECT_EQ(Cpu()->device(), c10::Device(c10::kCPU));
  auto meta = MakeFlatOps(c10::Device(c10::kMeta));
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(meta.status().message().find("no training kernels for device meta"), std::string::npos)
      << meta.status();
}

TEST(FlatOps, ScaleAndSingleElements) {
  auto ops = Cpu();
  at::Tensor x = at::arange(6, at::kFloat);
  ops->Scale(x.narrow(0, 2, 3), 0.5f);
  EXPECT_TRUE(at::equal(x, at::tensor({0.f, 1.f, 1.f, 1.5f, 2.f, 5.f})));
  ops->Set(x, 5, 7.25f);
  EXPECT_EQ(ops->Get(x, 5), 7.25f);
  EXPECT_THROW(ops->Get(x, 6), c10::Error);
}

TEST(FlatOps, SumSquaresIsFp64RangeByRange) {
  auto ops = Cpu();
  at::Tensor x = Randn(100, 1);
  const std::vector<FlatRange> ranges = {{10, 20}, {50, 5}, {0, 3}};
  const float* p = x.data_ptr<float>();
  double want = 0.0;
  for (const FlatRange& r : ranges) {
    double acc = 0.0;
    for (int64_t i = r.offset; i < r.offset + r.length; ++i) acc += double(p[i]) * p[i];
    want += acc;
  }
  EXPECT_EQ(ops->SumSquares(x, ranges), want);  // bit for bit
  EXPECT_EQ(ops->SumSquares(x, {}), 0.0);
  EXPECT_THROW(ops->SumSquares(x, {{95, 10}}), c10::Error);
}

TEST(FlatOps, NormRangesCountReplicatedOnceAndClipToThePartition) {
  const std::vector<FlatSegment> segs = {
      {0, 4, false, false}, {4, 4, true, false}, {8, 4, false, false}};
  auto all = NormRanges(segs, 0, 12, /*count_replicated=*/true);
  ASSERT_EQ(all.size(), 3u);
  auto sharded = NormRanges(segs, 2, 10, /*count_replicated=*/false);
  ASSERT_EQ(sharded.size(), 2u);
  EXPECT_EQ(sharded[0].offset, 2);
  EXPECT_EQ(sharded[0].length, 2);
  EXPECT_EQ(sharded[1].offset, 8);
  EXPECT_EQ(sharded[1].length, 2);
}

TEST(FlatOps, KvStagingRoundTrip) {
  auto ops = Cpu();
  at::Tensor g = at::arange(10, at::kFloat);
  const std::vector<FlatRange> kv = {{3, 3}, {8, 2}};
  at::Tensor snap = at::ones({5});
  at::Tensor delta = at::empty({5});
  ops->PackDelta(g, kv, snap, delta);
  EXPECT_TRUE(at::equal(delta, at::tensor({2.f, 3.f, 4.f, 7.f, 8.f})));
  delta.mul_(2);  // what the all-reduce would do with two equal ranks
  ops->UnpackDelta(g, kv, delta, snap, /*add_snapshot=*/true);
  EXPECT_TRUE(at::equal(g, at::tensor({0.f, 1.f, 2.f, 5.f, 7.f, 9.f, 6.f, 7.f, 15.f, 17.f})));
  EXPECT_TRUE(at::equal(snap, at::tensor({5.f, 7.f, 9.f, 15.f, 17.f})));
  ops->UnpackDelta(g, kv, at::zeros({5}), snap, /*add_snapshot=*/false);
  EXPECT_EQ(ops->Get(g, 3), 0.0f);
  EXPECT_TRUE(at::equal(snap, at::zeros({5})));
  ops->Set(g, 9, 4.0f);
  ops->Pack(g, kv, snap);
  EXPECT_TRUE(at::equal(snap, at::tensor({0.f, 0.f, 0.f, 0.f, 4.f})));
}

TEST(FlatOps, SgdAndAdamWFollowTorchOptim) {
  auto ops = Cpu();
  at::Tensor p = Randn(64, 2), g = Randn(64, 3);
  at::Tensor p0 = p.clone();
  ops->SgdStep(p, g, 0.1f);
  EXPECT_TRUE(at::allclose(p, p0 - 0.1 * g, 0, 1e-7));

  // Two AdamW steps against torch.optim.AdamW's formula, in fp64.
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  at::Tensor m = at::zeros({64}), v = at::zeros({64});
  at::Tensor pd = p.to(at::kDouble), md = at::zeros({64}, at::kDouble), vd = md.clone();
  for (int t = 1; t <= 2; ++t) {
    at::Tensor gt = Randn(64, 10 + t);
    AdamWScalars s;
    s.beta1 = b1;
    s.beta2 = b2;
    s.eps = eps;
    s.decay = 1.0 - lr * wd;
    s.step_size = lr / (1.0 - std::pow(b1, t));
    s.bc2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
    ops->AdamWStep(p, gt, m, v, s);
    at::Tensor gd = gt.to(at::kDouble);
    pd.mul_(1.0 - lr * wd);
    md = b1 * md + (1 - b1) * gd;
    vd = b2 * vd + (1 - b2) * gd * gd;
    pd -=
        (lr / (1.0 - std::pow(b1, t))) * md / (vd.sqrt() / std::sqrt(1.0 - std::pow(b2, t)) + eps);
  }
  EXPECT_TRUE(at::allclose(p.to(at::kDouble), pd, 0, 1e-6));
  EXPECT_THROW(ops->SgdStep(p, g.narrow(0, 0, 10), 0.1f), c10::Error);
  EXPECT_THROW(ops->SgdStep(p.to(at::kDouble), g.to(at::kDouble), 0.1f), c10::Error);
}

// The contract's per-element fp32 sequence, one element at a time (the reference numerics).
void ScalarAdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] *= s.decay;
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g[i];
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / s.bc2_sqrt + s.eps;
    p[i] -= s.step_size * m[i] / denom;
  }
}

TEST(FlatOps, AdamWIsTheScalarSequenceByteForByte) {
  auto ops = Cpu();
  const int64_t n = 1027;  // not a multiple of any vector width: the tail runs too
  at::Tensor p = Randn(n, 20), m = at::zeros({n}), v = at::zeros({n});
  at::Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
  for (int t = 1; t <= 3; ++t) {
    at::Tensor g = Randn(n, 20 + t) * (t == 2 ? 1e-20 : 1.0);  // tiny values: denormal v
    AdamWScalars s;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.decay = 1.0f - 1e-3f * 0.01f;
    s.step_size = static_cast<float>(1e-3 / (1.0 - std::pow(0.9, t)));
    s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
    ops->AdamWStep(p, g, m, v, s);
    ScalarAdamW(pr.data_ptr<float>(), g.data_ptr<float>(), mr.data_ptr<float>(),
                vr.data_ptr<float>(), n, s);
    ASSERT_TRUE(at::equal(p, pr)) << "step " << t;
    ASSERT_TRUE(at::equal(m, mr)) << "step " << t;
    ASSERT_TRUE(at::equal(v, vr)) << "step " << t;
  }
}

TEST(FlatOps, CopyRoundsToBf16LikeTorch) {
  auto ops = Cpu();
  at::Tensor src = Randn(257, 4);
  at::Tensor dst = at::empty({257}, at::kBFloat16);
  ops->Copy(dst, src);
  EXPECT_TRUE(at::equal(dst, src.to(at::kBFloat16)));
  at::Tensor back = at::empty({257});
  ops->Copy(back, dst);
  EXPECT_TRUE(at::equal(back, dst.to(at::kFloat)));
}

TEST(FlatOps, AddToWidensBf16Gradients) {
  auto ops = Cpu();
  at::Tensor acc = Randn(100, 5);
  at::Tensor g = Randn(100, 6).to(at::kBFloat16);
  at::Tensor want = acc + g.to(at::kFloat);
  ops->AddTo(acc, g);
  EXPECT_TRUE(at::equal(acc, want));
  EXPECT_THROW(ops->AddTo(g, acc), c10::Error);  // the accumulator must be fp32
}

}  // namespace
}  // namespace latchkey
