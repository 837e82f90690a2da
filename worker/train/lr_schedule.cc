#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace latchkey {

LrSchedule::LrSchedule(const SchedulerConfig& config, double optimizer_lr)
    : c_(config),
      optimizer_lr_(optimizer_lr),
      warmup_(std::max<int64_t>(2, config.warmup_num_steps)) {}

double LrSchedule::WarmupGamma(int64_t i) const {
  if (c_.warmup_type == WarmupType::kLinear) {
    return static_cast<double>(i) / static_cast<double>(warmup_);
  }
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warmup_));
  return inverse_log_warm_up * std::log(static_cast<double>(i + 1));
}

double LrSchedule::AtIteration(int64_t i) const {
  switch (c_.type) {
    case SchedulerType::kNone:
      return optimizer_lr_;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR: {
      if (i < 0) return c_.warmup_min_lr;
      double gamma = 1.0;
      if (i < warmup_) {
        gamma = WarmupGamma(i);
      } else if (c_.type == SchedulerType::kWarmupDecayLR) {
        gamma = std::max(0.0, static_cast<double>(c_.total_num_steps - i) /
                                  std::max(1.0, static_cast<double>(c_.total_num_steps - warmup_)));
      }
      return c_.warmup_min_lr + (c_.warmup_max_lr - c_.warmup_min_lr) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < warmup_) {
        ratio = c_.warmup_min_ratio + WarmupGamma(i) * (1.0 - c_.warmup_min_ratio);
      } else {
        const double real_last_step = static_cast<double>(i - warmup_ + 1);
        const double real_total_steps = static_cast<double>(c_.total_num_steps - warmup_);
        const double progress = std::min(1.0, real_last_step / std::max(1.0, real_total_steps));
        const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
        ratio = std::max(0.0, c_.cos_min_ratio + (1.0 - c_.cos_min_ratio) * cosine);
      }
      return optimizer_lr_ * ratio;
    }
  }
  return optimizer_lr_;
}

}  // namespace latchkey
