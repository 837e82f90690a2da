#include "worker/train/evaluator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#include <cstring>
#include <utility>

#include "worker/data/megatron_source.h"
#include "worker/model/comm_buffer.h"

namespace latchkey {
namespace {

// Puts the model in evaluation mode (no dropout, eval-tagged collectives) for one scope.
class EvalMode {
 public:
  explicit EvalMode(GptBigCode& model) : model_(model), was_training_(model.training()) {
    model_.set_training(false);
    model_.set_collective_tag(kEvalTag);
  }
  ~EvalMode() {
    model_.set_training(was_training_);
    model_.set_collective_tag(nullptr);
  }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  GptBigCode& model_;
  bool was_training_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Open(const JobSpec& spec,
                                                           comm::ProcessGroups* groups,
                                                           const c10::Device& device) {
  // A split of the training data's Megatron dataset, built for exactly the K eval samples, or
  // a token file.
  auto source =
      !spec.eval.split.empty()
          ? OpenMegatronSource(
                spec,
                spec.eval.split == "validation" ? MegatronSplit::kValidation : MegatronSplit::kTest,
                spec.eval.samples)
          : OpenTokenFile(spec.eval.tokens_file, spec.eval.dtype, spec.seq_len,
                          spec.model.vocab_size, "latchkey.eval.tokens_file");
  if (!source.ok()) return source.status();
  return std::unique_ptr<Evaluator>(new Evaluator(spec, groups, device, *std::move(source)));
}

Evaluator::Evaluator(const JobSpec& spec, comm::ProcessGroups* groups, const c10::Device& device,
                     std::unique_ptr<TokenSource> source)
    : config_(spec.eval),
      steps_(spec.steps),
      seq_len_(spec.seq_len),
      g_(groups),
      device_(device),
      source_(std::move(source)) {}

bool Evaluator::Due(int64_t step) const {
  return (step + 1) % config_.every_steps == 0 || step == steps_ - 1;
}

absl::StatusOr<double> Evaluator::Run(GptBigCode& model) {
  const int S = seq_len_;
  double sum = 0.0;
  {
    EvalMode mode(model);
    at::NoGradGuard no_grad;
    at::Tensor tokens = at::empty({1, S + 1}, at::kLong);  // host: the source fills it
    for (int64_t k = g_->dp_rank; k < config_.samples; k += g_->dp) {
      if (absl::Status st = source_->Read(k, tokens.data_ptr<int64_t>()); !st.ok()) return st;
      const at::Tensor ids = tokens.narrow(1, 0, S).to(device_);
      const at::Tensor labels = tokens.narrow(1, 1, S).to(device_);
      // Without dropout the position selects nothing; the sample index stands in for it.
      sum += model.Loss(ids, labels, {k}).item<double>();
    }
  }
  if (comm::is_parallel(g_->dp_group)) {
    at::Tensor t = at::from_blob(&sum, {1}, at::kDouble).to(device_);
    comm::CollectiveOptions opts;
    opts.tag = kEvalTag;
    if (absl::Status st = g_->dp_group->AllReduceSum(CommBuffer(t), opts); !st.ok()) return st;
    if (!t.is_cpu()) std::memcpy(&sum, t.cpu().data_ptr<double>(), sizeof(double));
  }
  return sum / static_cast<double>(config_.samples);
}

}  // namespace latchkey
