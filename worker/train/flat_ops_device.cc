#include "worker/train/flat_ops_device.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#include <string>

namespace latchkey {
namespace {

class AtenFlatOps final : public FlatOps {
 public:
  explicit AtenFlatOps(c10::Device device) : device_(device) {}
  c10::Device device() const override { return device_; }

  void Scale(const at::Tensor& x, float s) const override {
    at::NoGradGuard no_grad;
    F32(x, "x").mul_(s);
  }

  double SumSquares(const at::Tensor& x, const std::vector<FlatRange>& ranges) const override {
    F32(x, "x");
    CheckFlatRanges(x, ranges);
    if (ranges.empty()) return 0.0;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> sums;
    sums.reserve(ranges.size());
    for (const FlatRange& r : ranges) {
      const at::Tensor d = x.narrow(0, r.offset, r.length).to(at::kDouble);
      sums.push_back(d.mul(d).sum());
    }
    const at::Tensor host = at::stack(sums).cpu();  // one transfer for every range
    const double* acc = host.data_ptr<double>();
    double total = 0.0;
    for (size_t i = 0; i < ranges.size(); ++i) total += acc[i];
    return total;
  }

  void Pack(const at::Tensor& x, const std::vector<FlatRange>& ranges,
            const at::Tensor& packed) const override {
    F32(x, "x");
    F32(packed, "packed");
    TORCH_CHECK(CheckFlatRanges(x, ranges) == packed.numel(), "packed size does not match ranges");
    at::NoGradGuard no_grad;
    int64_t at_ = 0;
    for (const FlatRange& r : ranges) {
      packed.narrow(0, at_, r.length).copy_(x.narrow(0, r.offset, r.length));
      at_ += r.length;
    }
  }

  void PackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                 const at::Tensor& snapshot, const at::Tensor& delta) const override {
    CheckDeltaArgs(x, ranges, snapshot, delta);
    at::NoGradGuard no_grad;
    int64_t at_ = 0;
    for (const FlatRange& r : ranges) {
      at::Tensor out = delta.narrow(0, at_, r.length);
      at::sub_out(out, x.narrow(0, r.offset, r.length), snapshot.narrow(0, at_, r.length));
      at_ += r.length;
    }
  }

  void UnpackDelta(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                   const at::Tensor& delta, const at::Tensor& snapshot,
                   bool add_snapshot) const override {
    CheckDeltaArgs(x, ranges, snapshot, delta);
    at::NoGradGuard no_grad;
    int64_t at_ = 0;
    for (const FlatRange& r : ranges) {
      at::Tensor xr = x.narrow(0, r.offset, r.length);
      at::Tensor snap = snapshot.narrow(0, at_, r.length);
      const at::Tensor d = delta.narrow(0, at_, r.length);
      if (add_snapshot) {
        at::add_out(xr, snap, d);
      } else {
        xr.copy_(d);
      }
      snap.copy_(xr);
      at_ += r.length;
    }
  }

  void SgdStep(const at::Tensor& p, const at::Tensor& g, float lr) const override {
    F32(p, "p");
    F32(g, "g");
    CheckSameSize(p, g);
    at::NoGradGuard no_grad;
    p.sub_(g.mul(lr));  // w -= lr * d: the product rounded, then the difference
  }

  void AdamWStep(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                 const AdamWScalars& s) const override {
    F32(p, "p");
    F32(g, "g");
    F32(m, "m");
    F32(v, "v");
    CheckSameSize(p, g);
    CheckSameSize(p, m);
    CheckSameSize(p, v);
    at::NoGradGuard no_grad;
    p.mul_(s.decay);
    m.mul_(s.beta1).add_(g.mul(1.0f - s.beta1));
    v.mul_(s.beta2).add_(g.mul(1.0f - s.beta2).mul_(g));
    const at::Tensor denom = v.sqrt().div_(s.bc2_sqrt).add_(s.eps);
    p.sub_(m.mul(s.step_size).div_(denom));
  }

  void AddTo(const at::Tensor& dst, const at::Tensor& src) const override {
    F32(dst, "dst");
    OnDevice(src, "src");
    CheckSameSize(dst, src);
    at::NoGradGuard no_grad;
    dst.add_(src.to(at::kFloat));
  }

  void Copy(const at::Tensor& dst, const at::Tensor& src) const override {
    OnDevice(dst, "dst");
    OnDevice(src, "src");
    CheckSameSize(dst, src);
    at::NoGradGuard no_grad;
    dst.copy_(src);
  }

  void Set(const at::Tensor& x, int64_t i, float v) const override {
    F32(x, "x");
    TORCH_CHECK(i >= 0 && i < x.numel(), "element ", i, " out of range");
    at::NoGradGuard no_grad;
    x.narrow(0, i, 1).fill_(v);
  }

  float Get(const at::Tensor& x, int64_t i) const override {
    F32(x, "x");
    TORCH_CHECK(i >= 0 && i < x.numel(), "element ", i, " out of range");
    return x.narrow(0, i, 1).item<float>();
  }

 private:
  void OnDevice(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.defined() && t.device() == device_ && t.is_contiguous() && t.dim() == 1, what,
                ": expected a 1-D contiguous tensor on ", device_.str());
  }
  const at::Tensor& F32(const at::Tensor& t, const char* what) const {
    OnDevice(t, what);
    TORCH_CHECK(t.scalar_type() == at::kFloat, what, ": expected float32, got ", t.scalar_type());
    return t;
  }
  // PackDelta's and UnpackDelta's arguments: all fp32 on this device, the snapshot and the delta
  // each as long as the ranges together.
  void CheckDeltaArgs(const at::Tensor& x, const std::vector<FlatRange>& ranges,
                      const at::Tensor& snapshot, const at::Tensor& delta) const {
    F32(x, "x");
    F32(snapshot, "snapshot");
    F32(delta, "delta");
    const int64_t total = CheckFlatRanges(x, ranges);
    TORCH_CHECK(total == snapshot.numel() && total == delta.numel(),
                "snapshot/delta size does not match ranges");
  }

  c10::Device device_;
};

}  // namespace

std::unique_ptr<FlatOps> MakeAtenFlatOps(const c10::Device& device) {
  return std::make_unique<AtenFlatOps>(device);
}

absl::StatusOr<std::unique_ptr<FlatOps>> MakeDeviceFlatOps(const c10::Device& device) {
  if (device.is_cuda() && at::hasCUDA()) return MakeAtenFlatOps(device);
  if (device.is_cuda()) {
    return absl::UnimplementedError("no training kernels for device " + device.str() +
                                    ": the libtorch this latchkey-worker links has no CUDA, or it "
                                    "sees no CUDA device");
  }
  return absl::UnimplementedError("no training kernels for device " + device.str() +
                                  " in this build (cpu, cuda)");
}

}  // namespace latchkey
