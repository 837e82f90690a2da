// The ATen FlatOps (the cuda implementation) against the CPU reference, run on CPU tensors here
// (the same code runs on a CUDA device): elementwise results bit for bit, norms to fp64
// rounding. And the cuda branch of MakeFlatOps with the libtorch this build links.
#include "worker/train/flat_ops_device.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace latchkey {
namespace {

at::Tensor Randn(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({n}, gen);
}

struct Both {
  std::unique_ptr<FlatOps> ref = *MakeFlatOps(c10::Device(c10::kCPU));
  std::unique_ptr<FlatOps> aten = MakeAtenFlatOps(c10::Device(c10::kCPU));
};

TEST(AtenFlatOps, ElementwiseOpsEqualTheCpuReference) {
  Both o;
  const int64_t n = 1000;
  const std::vector<FlatRange> ranges = {{3, 100}, {200, 0}, {400, 333}};
  at::Tensor x1 = Randn(n, 1), x2 = x1.clone();
  o.ref->Scale(x1, 0.37f);
  o.aten->Scale(x2, 0.37f);
  EXPECT_TRUE(at::equal(x1, x2));

  at::Tensor p1 = at::empty({433}), p2 = at::empty({433});
  o.ref->Pack(x1, ranges, p1);
  o.aten->Pack(x2, ranges, p2);
  EXPECT_TRUE(at::equal(p1, p2));

  at::Tensor snap1 = Randn(433, 2), snap2 = snap1.clone();
  at::Tensor d1 = at::empty({433}), d2 = at::empty({433});
  o.ref->PackDelta(x1, ranges, snap1, d1);
  o.aten->PackDelta(x2, ranges, snap2, d2);
  EXPECT_TRUE(at::equal(d1, d2));
  for (bool add : {true, false}) {
    o.ref->UnpackDelta(x1, ranges, d1, snap1, add);
    o.aten->UnpackDelta(x2, ranges, d2, snap2, add);
    EXPECT_TRUE(at::equal(x1, x2)) << add;
    EXPECT_TRUE(at::equal(snap1, snap2)) << add;
  }

  at::Tensor g = Randn(n, 3);
  o.ref->SgdStep(x1, g, 0.01f);
  o.aten->SgdStep(x2, g, 0.01f);
  EXPECT_TRUE(at::equal(x1, x2));

  AdamWScalars s;
  s.decay = 1.0f - 1e-3f * 0.1f;
  s.step_size = 1e-3f / (1.0f - 0.9f);
  s.bc2_sqrt = std::sqrt(1.0f - 0.999f);
  at::Tensor m1 = at::zeros({n}), m2 = at::zeros({n}), v1 = at::zeros({n}), v2 = at::zeros({n});
  for (int step = 0; step < 3; ++step) {
    at::Tensor gs = Randn(n, 10 + step);
    o.ref->AdamWStep(x1, gs, m1, v1, s);
    o.aten->AdamWStep(x2, gs, m2, v2, s);
  }
  EXPECT_TRUE(at::equal(m1, m2));
  EXPECT_TRUE(at::equal(v1, v2));
  // The CPU loop may contract a*b+c into one FMA where ATen rounds twice: to the last bit.
  EXPECT_TRUE(at::allclose(x1, x2, /*rtol=*/1e-6, /*atol=*/1e-7));

  const at::Tensor bf = Randn(n, 4).to(at::kBFloat16);
  o.ref->AddTo(x1, bf);
  o.aten->AddTo(x2, bf);
  EXPECT_TRUE(at::allclose(x1, x2, 1e-6, 1e-7));
  at::Tensor c1 = at::empty({n}, at::kBFloat16), c2 = at::empty({n}, at::kBFloat16);
  o.ref->Copy(c1, x1);
  o.aten->Copy(c2, x1);
  EXPECT_TRUE(at::equal(c1, c2));
  o.aten->Set(x2, 7, 2.5f);
  EXPECT_EQ(o.aten->Get(x2, 7), 2.5f);
  EXPECT_THROW(o.aten->Get(x2, n), c10::Error);
}

TEST(AtenFlatOps, SumSquaresMatchesTheReference) {
  Both o;
  const at::Tensor x = Randn(5000, 5);
  const std::vector<FlatRange> ranges = {{0, 1000}, {1500, 2500}, {4999, 1}};
  const double want = o.ref->SumSquares(x, ranges);
  EXPECT_NEAR(o.aten->SumSquares(x, ranges), want, want * 1e-12);
  EXPECT_EQ(o.aten->SumSquares(x, {}), 0.0);
}

TEST(AtenFlatOps, CudaIsRefusedByNameWhenTheLibtorchHasNoCudaOrNoDevice) {
  auto ops = MakeFlatOps(c10::Device(c10::kCUDA, 0));
  if (at::hasCUDA()) {
    ASSERT_TRUE(ops.ok()) << ops.status();
    EXPECT_EQ((*ops)->device(), c10::Device(c10::kCUDA, 0));
    return;
  }
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(ops.status().message().find("has no CUDA"), std::string::npos) << ops.status();
}

}  // namespace
}  // namespace latchkey
