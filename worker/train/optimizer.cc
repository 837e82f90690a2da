#include "worker/train/optimizer.h"

#include <cmath>

namespace latchkey {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(double lr, int64_t count) : lr_(static_cast<float>(lr)), count_(count) {}
  void Step(float* p, const float* g) override {
    for (int64_t i = 0; i < count_; ++i) p[i] -= lr_ * g[i];
  }
  int64_t state_bytes() const override { return 0; }

 private:
  float lr_;
  int64_t count_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& c, int64_t count)
      : c_(c), count_(count), m_(count, 0.0f), v_(count, 0.0f) {}

  void Step(float* p, const float* g) override {
    ++step_;
    const float lr = static_cast<float>(c_.lr);
    const float b1 = static_cast<float>(c_.betas[0]);
    const float b2 = static_cast<float>(c_.betas[1]);
    const float eps = static_cast<float>(c_.eps);
    const float decay = static_cast<float>(1.0 - c_.lr * c_.weight_decay);
    const double bc1 = 1.0 - std::pow(c_.betas[0], static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(c_.betas[1], static_cast<double>(step_));
    const float step_size = static_cast<float>(c_.lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    (void)lr;
    float* m = m_.data();
    float* v = v_.data();
    for (int64_t i = 0; i < count_; ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] -= step_size * m[i] / denom;
    }
  }
  int64_t state_bytes() const override {
    return static_cast<int64_t>((m_.size() + v_.size()) * sizeof(float));
  }

 private:
  OptimizerConfig c_;
  int64_t count_;
  int64_t step_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config, int64_t count) {
  if (config.type == OptimizerType::kSgd) return std::make_unique<Sgd>(config.lr, count);
  return std::make_unique<AdamW>(config, count);
}

}  // namespace latchkey
