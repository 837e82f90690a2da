// The learning rate of every optimizer step: DeepSpeed's LR schedules (lr_schedules.py's
// WarmupLR, WarmupDecayLR, WarmupCosineLR), or the optimizer's constant lr without a scheduler.
//
// DeepSpeed's scheduler holds last_batch_iteration, -1 before the first step() and one more after
// each. The lr used by optimizer step s (0-based) is the schedule's value at
// last_batch_iteration = s - 1; at -1 it is the schedule's start (warmup_min_lr for WarmupLR and
// WarmupDecayLR, ratio 0 for WarmupCosineLR). So steps 0 and 1 both get the start value.
// With W = max(2, warmup_num_steps) and i = last_batch_iteration >= 0:
//   warmup gamma (i < W):  log: log(i + 1) / log(W);  linear: i / W
//   WarmupLR:        lr = min + (max - min) * (i < W ? gamma : 1)
//   WarmupDecayLR:   lr = min + (max - min) * (i < W ? gamma : max(0, (T - i) / max(1, T - W)))
//   WarmupCosineLR:  lr = optimizer_lr * ratio, with
//                      i < W: ratio = warmup_min_ratio + (1 - warmup_min_ratio) * gamma
//                      else:  p = min(1, (i - W + 1) / max(1, T - W));
//                             ratio = max(0, cos_min + (1 - cos_min) * (1 + cos(pi p)) / 2)
// (T = total_num_steps). Everything is float64; the optimizers round it as torch does.
// Torch-free. Thread-safety: immutable after construction.
#ifndef LATCHKEY_WORKER_TRAIN_LR_SCHEDULE_H_
#define LATCHKEY_WORKER_TRAIN_LR_SCHEDULE_H_

#include <cstdint>

#include "common/job_spec.h"

namespace latchkey {

class LrSchedule {
 public:
  // `optimizer_lr`: the constant lr without a scheduler, and WarmupCosineLR's base.
  LrSchedule(const SchedulerConfig& config, double optimizer_lr);

  // DeepSpeed's lr at last_batch_iteration = i (i <= -1: the start value).
  double AtIteration(int64_t i) const;
  // The lr of optimizer step s (0-based): AtIteration(s - 1).
  double ForStep(int64_t step) const { return AtIteration(step - 1); }

 private:
  double WarmupGamma(int64_t i) const;

  SchedulerConfig c_;
  double optimizer_lr_;
  int64_t warmup_;  // warmup_num_steps raised to at least 2
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_LR_SCHEDULE_H_
