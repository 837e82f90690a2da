#include "worker/train/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace latchkey {
namespace {

// Every name in `state` must be one of `want` (all present, fp32, `count` elements).
absl::Status CheckState(const std::map<std::string, at::Tensor>& state,
                        const std::map<std::string, at::Tensor>& want) {
  for (const auto& [name, t] : state) {
    if (want.count(name) == 0) return absl::InvalidArgumentError("unexpected optimizer." + name);
  }
  for (const auto& [name, mine] : want) {
    auto it = state.find(name);
    if (it == state.end()) return absl::InvalidArgumentError("missing optimizer." + name);
    if (it->second.scalar_type() != at::kFloat || it->second.numel() != mine.numel()) {
      return absl::InvalidArgumentError("optimizer." + name + " has " +
                                        std::to_string(it->second.numel()) + " elements of " +
                                        std::string(c10::toString(it->second.scalar_type())) +
                                        ", expected " + std::to_string(mine.numel()) + " Float");
    }
  }
  return absl::OkStatus();
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const FlatOps* ops) : ops_(ops) {}
  void Step(const at::Tensor& p, const at::Tensor& g, double lr) override {
    ++step_;
    ops_->SgdStep(p, g, static_cast<float>(lr));
  }
  int64_t state_bytes() const override { return 0; }
  int64_t steps() const override { return step_; }
  std::map<std::string, at::Tensor> state() const override { return {}; }
  absl::Status LoadState(int64_t steps, const std::map<std::string, at::Tensor>& state) override {
    if (absl::Status st = CheckState(state, {}); !st.ok()) return st;
    step_ = steps;
    return absl::OkStatus();
  }

 private:
  const FlatOps* ops_;
  int64_t step_ = 0;
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
  int64_t steps() const override { return step_; }
  std::map<std::string, at::Tensor> state() const override {
    return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
  }
  absl::Status LoadState(int64_t steps, const std::map<std::string, at::Tensor>& state) override {
    if (absl::Status st = CheckState(state, this->state()); !st.ok()) return st;
    ops_->Copy(m_, state.at("exp_avg").reshape({-1}).to(m_.device()).contiguous());
    ops_->Copy(v_, state.at("exp_avg_sq").reshape({-1}).to(v_.device()).contiguous());
    step_ = steps;
    return absl::OkStatus();
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
