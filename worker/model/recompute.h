// Activation recomputation (checkpointing) for the libtorch C++ API, which has no
// torch.utils.checkpoint: Recompute(fn, inputs) returns fn(inputs) while keeping, for the
// backward, only `inputs`; the backward runs fn again on them, with grad enabled, and
// back-propagates through that second graph into the inputs and into every tensor fn read that
// requires grad (the parameters), which accumulate their gradients as if fn had been recorded.
//
// Contract on fn: it must be a pure function of its inputs and of state that does not change
// between the forward and the backward (parameters are not updated in between; dropout masks are
// functions of positions, not of a generator's state), so the replay computes the same values bit
// for bit; it returns fresh tensors (no input itself, no view of one). The inputs must not be
// modified in place after the call (autograd's version check throws c10::Error when they are).
// fn is called twice per backward'ed forward: its side effects (collectives) happen twice.
//
// Errors: whatever fn throws, in the forward or in the replay (a comm::CollectiveError passes
// through autograd's backward() to its caller unchanged).
// Thread-safety: as the autograd engine's; fn runs on the thread that runs the backward.
#ifndef LATCHKEY_WORKER_MODEL_RECOMPUTE_H_
#define LATCHKEY_WORKER_MODEL_RECOMPUTE_H_

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace latchkey {

using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(inputs), recorded as one autograd node that saves only `inputs`. When grad mode is off or
// no input requires grad, fn runs plainly (recorded as usual when grad mode is on): parameters
// reached only through fn would otherwise get no gradient.
std::vector<at::Tensor> Recompute(RecomputeFn fn, const std::vector<at::Tensor>& inputs);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_RECOMPUTE_H_
