#include "worker/train/flat_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#ifdef __SSE2__
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <string>

#include "worker/train/flat_ops_device.h"

namespace latchkey {
namespace {

// The CPU kernels: plain loops in the order the contract states (the reference numerics).
class CpuFlatOps final : public FlatOps {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  void Scale(const at::Tensor& x, float s) const override {
    float* p = F32(x, "x");
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
  }

  double SumSquares(const at::Tensor& x, const std::vector<FlatRange>& ranges) const override {
    const float* g = F32(x, "x");
    CheckFlatRanges(x, ranges);
    double total = 0.0;
    for (const FlatRange& r : ranges) {
      double acc = 0.0;
      for (int64_t i = r.offset; i < r.offset + r.length; ++i) {
        acc += static_cast<double>(g[i]) * g[i];
      }
      total += acc;
    }
    return total;
  }

  void Pack(const at::Tensor& x, const std::vector<FlatRange>& ranges,
            const at::Tensor& packed) const override {
    const float* g = F32(x, "x");
    float* out = F32(packed, "packed");
    TORCH_CHECK(CheckFlatRanges(x, ranges) == packed.numel(), "packed size does not match ranges");
    for (const FlatRange& r : ranges) {
      std::memcpy(out, g + r.offset, r.length * sizeof(float));
      out += r.length;
    }
  }

  void PackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                 const at::Tensor& snapshot, const at::Tensor& delta) const override {
    const float* g = F32(x, "x");
    const float* snap = F32(snapshot, "snapshot");
    float* st = F32(delta, "delta");
    const int64_t total = CheckFlatRanges(x, ranges);
    TORCH_CHECK(total == snapshot.numel() && total == delta.numel(),
                "snapshot/delta size does not match ranges");
    for (const FlatRange& r : ranges) {
      const float* gr = g + r.offset;
      for (int64_t i = 0; i < r.length; ++i) st[i] = gr[i] - snap[i];
      snap += r.length;
      st += r.length;
    }
  }

  void UnpackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                   const at::Tensor& delta, const at::Tensor& snapshot,
                   bool add_snapshot) const override {
    float* g = F32(x, "x");
    const float* st = F32(delta, "delta");
    float* snap = F32(snapshot, "snapshot");
    const int64_t total = CheckFlatRanges(x, ranges);
    TORCH_CHECK(total == snapshot.numel() && total == delta.numel(),
                "snapshot/delta size does not match ranges");
    for (const FlatRange& r : ranges) {
      float* gr = g + r.offset;
      if (add_snapshot) {
        for (int64_t i = 0; i < r.length; ++i) gr[i] = snap[i] + st[i];
      } else {
        std::memcpy(gr, st, r.length * sizeof(float));
      }
      std::memcpy(snap, gr, r.length * sizeof(float));
      snap += r.length;
      st += r.length;
    }
  }

  void SgdStep(const at::Tensor& p, const at::Tensor& g, float lr) const override {
    float* w = F32(p, "p");
    const float* d = F32(g, "g");
    CheckSameSize(p, g);
    const int64_t n = p.numel();
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * d[i];
  }

  void AdamWStep(const at::Tensor& p_t, const at::Tensor& g_t, const at::Tensor& m_t,
                 const at::Tensor& v_t, const AdamWScalars& s) const override {
    float* p = F32(p_t, "p");
    const float* g = F32(g_t, "g");
    float* m = F32(m_t, "m");
    float* v = F32(v_t, "v");
    CheckSameSize(p_t, g_t);
    CheckSameSize(p_t, m_t);
    CheckSameSize(p_t, v_t);
    const float b1 = s.beta1;
    const float b2 = s.beta2;
    const int64_t n = p_t.numel();
    int64_t i = 0;
#ifdef __SSE2__
    // Four elements at a time, with exactly the scalar loop's operations in its order (SSE's
    // mul, add, sub, div and sqrt round like the scalar ones, and nothing is fused), so the
    // results are the same bytes.
    const __m128 decay = _mm_set1_ps(s.decay), vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2);
    const __m128 c1 = _mm_set1_ps(1.0f - b1), c2 = _mm_set1_ps(1.0f - b2);
    const __m128 bc2 = _mm_set1_ps(s.bc2_sqrt), eps = _mm_set1_ps(s.eps);
    const __m128 step = _mm_set1_ps(s.step_size);
    for (; i + 4 <= n; i += 4) {
      const __m128 gi = _mm_loadu_ps(g + i);
      const __m128 pi = _mm_mul_ps(_mm_loadu_ps(p + i), decay);
      const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(c1, gi));
      const __m128 vi =
          _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(c2, gi), gi));
      const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2), eps);
      _mm_storeu_ps(m + i, mi);
      _mm_storeu_ps(v + i, vi);
      _mm_storeu_ps(p + i, _mm_sub_ps(pi, _mm_div_ps(_mm_mul_ps(step, mi), denom)));
    }
#endif
    for (; i < n; ++i) {
      p[i] *= s.decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / s.bc2_sqrt + s.eps;
      p[i] -= s.step_size * m[i] / denom;
    }
  }

  void AddTo(const at::Tensor& dst, const at::Tensor& src) const override {
    F32(dst, "dst");
    OnCpu(src, "src");
    CheckSameSize(dst, src);
    at::NoGradGuard no_grad;
    dst.add_(src.to(at::kFloat));  // the widening is exact; one fp32 add per element
  }

  void Copy(const at::Tensor& dst, const at::Tensor& src) const override {
    OnCpu(dst, "dst");
    OnCpu(src, "src");
    CheckSameSize(dst, src);
    at::NoGradGuard no_grad;
    dst.copy_(src);
  }

  void Set(const at::Tensor& x, int64_t i, float v) const override {
    float* p = F32(x, "x");
    TORCH_CHECK(i >= 0 && i < x.numel(), "element ", i, " out of range");
    p[i] = v;
  }

  float Get(const at::Tensor& x, int64_t i) const override {
    const float* p = F32(x, "x");
    TORCH_CHECK(i >= 0 && i < x.numel(), "element ", i, " out of range");
    return p[i];
  }

 private:
  static void OnCpu(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.defined() && t.is_cpu() && t.is_contiguous() && t.dim() == 1, what,
                ": expected a 1-D contiguous CPU tensor");
  }
  static float* F32(const at::Tensor& t, const char* what) {
    OnCpu(t, what);
    TORCH_CHECK(t.scalar_type() == at::kFloat, what, ": expected float32, got ", t.scalar_type());
    return t.data_ptr<float>();
  }
};

}  // namespace

void CheckSameSize(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.numel() == b.numel(), "sizes differ: ", a.numel(), " vs ", b.numel());
}

int64_t CheckFlatRanges(const at::Tensor& x, const std::vector<FlatRange>& ranges) {
  int64_t total = 0;
  for (const FlatRange& r : ranges) {
    TORCH_CHECK(r.offset >= 0 && r.length >= 0 && r.offset + r.length <= x.numel(), "range [",
                r.offset, ", ", r.offset + r.length, ") outside ", x.numel());
    total += r.length;
  }
  return total;
}

absl::StatusOr<std::unique_ptr<FlatOps>> MakeFlatOps(const c10::Device& device) {
  if (device.is_cpu()) return std::make_unique<CpuFlatOps>();
  return MakeDeviceFlatOps(device);
}

}  // namespace latchkey
