#include "worker/model/recompute.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace latchkey {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The function to replay, owned by the autograd node (its saved_data holds IValues only, so the
// closure travels as a capsule): freed with the graph, whether or not the backward runs.
struct Closure : public torch::CustomClassHolder {
  RecomputeFn fn;
};

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // Autograd calls this with grad mode off: fn builds no graph, and every intermediate it makes
  // is freed when it returns; only the inputs are saved.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               c10::intrusive_ptr<Closure> closure) {
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    std::vector<at::Tensor> out = closure->fn(in);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(std::move(closure));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto closure = c10::static_intrusive_pointer_cast<Closure>(ctx->saved_data["fn"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    // Detached leaves over the same storage and strides (so the replay runs the same kernels on
    // the same layouts): the replayed graph ends at them, and their .grad is what flows on.
    std::vector<at::Tensor> leaves;
    leaves.reserve(saved.size());
    for (const at::Tensor& s : saved) {
      at::Tensor d = s.detach();
      d.requires_grad_(s.requires_grad());
      leaves.push_back(std::move(d));
    }
    std::vector<at::Tensor> outputs;
    {
      // The engine runs backward functions with grad mode off (create_graph false).
      at::AutoGradMode enable(true);
      outputs = closure->fn(leaves);
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "Recompute: the replay returned ",
                outputs.size(), " tensors, the forward ", grad_outputs.size());
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // A reentrant backward (the engine supports it): accumulates into the parameters' .grad as
    // the recorded graph would have, and into the leaves'.
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    result.reserve(leaves.size() + 1);
    for (const at::Tensor& d : leaves) {
      result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    }
    result.emplace_back();  // the closure
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> Recompute(RecomputeFn fn, const std::vector<at::Tensor>& inputs) {
  bool any_requires_grad = false;
  for (const at::Tensor& x : inputs) any_requires_grad |= x.defined() && x.requires_grad();
  if (!at::GradMode::is_enabled() || !any_requires_grad) return fn(inputs);
  auto closure = c10::make_intrusive<Closure>();
  closure->fn = std::move(fn);
  return RecomputeFunction::apply(at::TensorList(inputs), std::move(closure));
}

}  // namespace latchkey
