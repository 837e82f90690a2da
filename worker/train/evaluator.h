// The evaluation loss of `latchkey.eval` (docs/observability.md): after the update of step s,
// when (s + 1) % every_steps == 0 or s is the last step, every rank takes part in
//
//   eval_loss = (1/K) * sum over eval samples k = 0..K-1 of that sample's mean token cross entropy
//
// where eval sample k is sample (k mod the eval file's sample count) of the eval token file, cut as
// training samples are (docs/data.md). DP rank d computes the samples k = d, d + DP, ... (< K);
// the TP ranks of a replica compute them together, as in training. Each sample is its own forward
// (batch 1), so its loss does not depend on the layout or on what shares its batch; the per-sample
// losses are summed in float64 and that sum is all-reduced over the DP group (float64), so any K
// works with any DP.
//
// Forward only: no autograd graph, no dropout, and no random number drawn from either dropout
// stream, so training continues exactly as it would without evaluation. Every collective it
// issues (the model's TP all-reduces and the DP sum) is tagged kEvalTag (common/step_report.h).
// Thread-safety: one thread (the training thread). Lifetime: `groups` outlives the evaluator.
// Errors: a failed DP sum comes back as a Status; a TP collective failing inside the forward
// throws comm::CollectiveError, as in training.
#ifndef LATCHKEY_WORKER_TRAIN_EVALUATOR_H_
#define LATCHKEY_WORKER_TRAIN_EVALUATOR_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/comm/process_groups.h"
#include "worker/data/token_source.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/train/engine.h"

namespace latchkey {

class Evaluator {
 public:
  // Reads spec.eval.tokens_file whole, or opens spec.eval.split of the Megatron dataset of
  // latchkey.data built for the K eval samples (worker/data/megatron_source.h). Errors name
  // latchkey.eval.tokens_file: missing file, size not a multiple of the dtype, fewer than
  // seq_len + 1 tokens, an id >= vocab_size; or are the Megatron source's.
  // REQUIRES: spec.eval.enabled().
  static absl::StatusOr<std::unique_ptr<Evaluator>> Open(const JobSpec& spec,
                                                         comm::ProcessGroups* groups,
                                                         const c10::Device& device);

  // Whether evaluation runs after the update of step (window) `step`.
  bool Due(int64_t step) const;
  // The evaluation loss of the model as it is now (every rank gets the same value).
  absl::StatusOr<double> Run(GptBigCode& model);

 private:
  Evaluator(const JobSpec& spec, comm::ProcessGroups* groups, const c10::Device& device,
            std::unique_ptr<TokenSource> source);

  EvalConfig config_;
  int64_t steps_;
  int seq_len_;
  comm::ProcessGroups* g_;
  c10::Device device_;
  std::unique_ptr<TokenSource> source_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_EVALUATOR_H_
