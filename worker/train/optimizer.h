// Optimizers over a contiguous range of the flat fp32 parameter buffer (ZeRO-1: the rank's
// partition; ZeRO-0: everything). State is allocated for that range only, on the device of the
// FlatOps it runs through (the only place its arithmetic happens).
// The learning rate comes with every step (the schedule's float64 value, lr_schedule.h), used as
// torch.optim uses a param group's lr: SGD without momentum p -= lr*g; AdamW with decoupled weight
// decay p *= 1 - lr*wd, applied to every parameter, and bias-corrected moments with
// step_size = lr / (1 - beta1^t). A step with lr 0 still advances AdamW's moments and step count.
// Thread-safety: one thread. Lifetime: `ops` outlives the optimizer.
#ifndef LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_
#define LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "worker/train/flat_ops.h"

namespace latchkey {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params -= update(grads, lr), element by element. REQUIRES: both fp32, 1-D, contiguous, on the
  // ops' device, with the `count` elements this optimizer was made for; lr >= 0.
  virtual void Step(const at::Tensor& params, const at::Tensor& grads, double lr) = 0;
  // Bytes of optimizer state tensors held by this rank.
  virtual int64_t state_bytes() const = 0;
  // Steps taken (AdamW's bias-correction t).
  virtual int64_t steps() const = 0;
  // The state tensors by name (AdamW: "exp_avg", "exp_avg_sq"; SGD: none), the live buffers.
  virtual std::map<std::string, at::Tensor> state() const = 0;
  // Replaces the step count and the state tensors (copied byte for byte onto the ops' device).
  // INVALID_ARGUMENT naming the tensor when one is missing, extra, or of another size or dtype.
  virtual absl::Status LoadState(int64_t steps, const std::map<std::string, at::Tensor>& state) = 0;
};

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config, int64_t count,
                                         const FlatOps* ops);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_OPTIMIZER_H_
