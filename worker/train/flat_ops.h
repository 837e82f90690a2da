// FlatOps: every numeric operation the training core performs on the flat parameter, gradient
// and optimizer-state buffers (ParamStore's flat fp32 buffers, the bf16 compute buffer, the K/V
// staging buffers, AdamW's moments), behind one interface. The engine, the K/V reducer, the
// optimizers and the grad norm touch those numbers only through it, so running the core on
// another device means adding an implementation here, not rewriting them.
//
// Every tensor argument is a 1-D contiguous tensor on device() (usually a narrow() of a flat
// buffer); fp32 unless stated. Results that the host needs (a norm, one element) come back as
// host scalars. Violations (wrong device, dtype, layout or size) are programming errors and
// throw c10::Error.
//
// Numerics: the CPU implementation is the reference. It runs each element's arithmetic in the
// order written below, in fp32, with no fused or reassociated forms (no FMA, alpha-scaled
// adds, addcdiv or lerp), and sums norms in fp64 range by range, so that results are bit-for-bit
// reproducible run to run. Another device's implementation keeps the same formulas; its
// rounding may differ.
// Thread-safety: implementations are stateless; any thread may call them.
#ifndef LATCHKEY_WORKER_TRAIN_FLAT_OPS_H_
#define LATCHKEY_WORKER_TRAIN_FLAT_OPS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace latchkey {

// Elements [offset, offset + length) of a flat buffer.
struct FlatRange {
  int64_t offset = 0;
  int64_t length = 0;
};

// The per-step scalars of torch.optim.AdamW's update (computed on the host from the step count).
struct AdamWScalars {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float decay = 1.0f;      // 1 - lr * weight_decay
  float step_size = 0.0f;  // lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^t)
};

class FlatOps {
 public:
  virtual ~FlatOps() = default;

  // The device whose tensors this implementation takes.
  virtual c10::Device device() const = 0;

  // x[i] *= s.
  virtual void Scale(const at::Tensor& x, float s) const = 0;

  // For each range in order: acc = sum over the range of double(x[i]) * x[i], in index order;
  // total += acc. Returns total (0 for no ranges).
  virtual double SumSquares(const at::Tensor& x, const std::vector<FlatRange>& ranges) const = 0;

  // packed = x[ranges] (the ranges' elements back to back). REQUIRES: packed holds their total.
  virtual void Pack(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                    const at::Tensor& packed) const = 0;
  // delta = x[ranges] - snapshot (element by element, ranges back to back).
  virtual void PackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                         const at::Tensor& snapshot, const at::Tensor& delta) const = 0;
  // x[ranges] = add_snapshot ? snapshot + delta : delta; then snapshot = x[ranges].
  virtual void UnpackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                           const at::Tensor& delta, const at::Tensor& snapshot,
                           bool add_snapshot) const = 0;

  // SGD without momentum: p[i] -= lr * g[i].
  virtual void SgdStep(const at::Tensor& p, const at::Tensor& g, float lr) const = 0;
  // torch.optim.AdamW, per element:
  //   p *= decay; m = b1*m + (1-b1)*g; v = b2*v + ((1-b2)*g)*g;
  //   denom = sqrt(v)/bc2_sqrt + eps; p -= (step_size*m)/denom.
  virtual void AdamWStep(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                         const at::Tensor& v, const AdamWScalars& s) const = 0;

  // dst[i] += float(src[i]): folds a gradient computed in bf16 (or fp32) into the fp32
  // accumulation buffer. REQUIRES: same number of elements.
  virtual void AddTo(const at::Tensor& dst, const at::Tensor& src) const = 0;

  // dst = src converted to dst's dtype (fp32 <-> bf16; to bf16 rounds to nearest even, as torch's
  // copy_). REQUIRES: same number of elements.
  virtual void Copy(const at::Tensor& dst, const at::Tensor& src) const = 0;

  // x[i] = v, and x[i] read back to the host.
  virtual void Set(const at::Tensor& x, int64_t i, float v) const = 0;
  virtual float Get(const at::Tensor& x, int64_t i) const = 0;
};

// Argument checks every implementation makes (TORCH_CHECK: they throw c10::Error, as the
// FlatOps methods do): equal element counts; ranges inside `x`, returning their total length.
void CheckSameSize(const at::Tensor& a, const at::Tensor& b);
int64_t CheckFlatRanges(const at::Tensor& x, const std::vector<FlatRange>& ranges);

// The implementation for `device`: the CPU's; UNIMPLEMENTED for a device this build has no
// kernels for (naming it).
absl::StatusOr<std::unique_ptr<FlatOps>> MakeFlatOps(const c10::Device& device);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_FLAT_OPS_H_
