#include "worker/train/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace latchkey {
namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const FlatOps* ops) : ops_(ops) {}
  void Step(const at::Tensor& p, const at::Tensor& g, double lr) override {
    ops_->SgdStep(p, g, static_cast<float>(lr));
  }
  int64_t state_bytes() const override { return 0; }

 private:
  const FlatOps* ops_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& c, int64_t count, const FlatOps* ops)
      : c_(c),
        ops_(ops),
        m_(at::zeros({count}, at::TensorOptions().dtype(at::kFloat).device(ops->device()))),
        v_(at::zeros({count}, at::TensorOptions().dtype(at::kFloat).device(ops->device()))) {}

  void Step(const at::Tensor& p, const at::Tensor& g, double lr) override {
    ++step_;
    const double bc1 = 1.0 - std::pow(c_.betas[0], static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(c_.betas[1], static_cast<double>(step_));
    AdamWScalars s;
    s.beta1 = static_cast<float>(c_.betas[0]);
    s.beta2 = static_cast<float>(c_.betas[1]);
    s.eps = static_cast<float>(c_.eps);
    s.decay = static_cast<float>(1.0 - lr * c_.weight_decay);
    s.step_size = static_cast<float>(lr / bc1);
    s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    ops_->AdamWStep(p, g, m_, v_, s);
  }
  int64_t state_bytes() const override {
    return static_cast<int64_t>((m_.numel() + v_.numel()) * sizeof(float));
  }

 private:
  OptimizerConfig c_;
  const FlatOps* ops_;
  int64_t step_ = 0;
  at::Tensor m_;
  at::Tensor v_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config, int64_t count,
                                         const FlatOps* ops) {
  if (config.type == OptimizerType::kSgd) return std::make_unique<Sgd>(ops);
  return std::make_unique<AdamW>(config, count, ops);
}

}  // namespace latchkey
