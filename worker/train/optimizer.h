// Optimizers over a contiguous range of the flat fp32 parameter buffer (ZeRO-1: the rank's
// partition; ZeRO-0: everything). State is allocated for that range only.
// Constant learning rate. Formulas are torch.optim's (SGD without momentum; AdamW with decoupled
// weight decay applied to every parameter and bias-corrected moments).
// Thread-safety: one thread.
#ifndef LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_
#define LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/job_spec.h"

namespace latchkey {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params[i] -= update(grads[i]) for i in [0, count): the range this optimizer was made for.
  virtual void Step(float* params, const float* grads) = 0;
  // Bytes of optimizer state tensors held by this rank.
  virtual int64_t state_bytes() const = 0;
};

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config, int64_t count);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_
