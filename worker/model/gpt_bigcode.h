// GPTBigCode (HF transformers math, docs/model.md) over one tensor-parallel shard.
//
// With tp > 1 the forward issues 2 all-reduces per layer (after attn.c_proj and mlp.c_proj, the
// row-parallel matmuls) and the backward 2 (input gradients of c_attn and c_fc), through the TP
// group. The replicated K/V gradient is NOT reduced here: that is the KvReducer's job.
// A TP collective that fails (inside Loss/Logits or inside autograd's backward()) throws
// comm::CollectiveError carrying the collective's Status; nothing else is caught here.
// Thread-safety: one thread at a time. Lifetime: `store` and `tp_group` outlive the model.
#ifndef LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_
#define LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_

#include <ATen/ATen.h>

#include <optional>

#include "common/job_spec.h"
#include "worker/comm/comm.h"
#include "worker/model/param_store.h"

namespace latchkey {

class GptBigCode {
 public:
  // `dropout_seed` feeds two streams (Megatron's rule): one shared by the TP group for replicated
  // activations (embd/resid dropout), one per rank for the sharded attention probabilities.
  GptBigCode(const ModelConfig& config, ParamStore* store, comm::Group* tp_group,
             uint64_t dropout_seed, int dp_rank);

  // input_ids, labels: [B, S] int64 on the store's device. Returns the mean cross entropy over all
  // B*S positions.
  at::Tensor Loss(const at::Tensor& input_ids, const at::Tensor& labels);
  // [B, S, vocab] logits.
  at::Tensor Logits(const at::Tensor& input_ids);

  // false: no dropout, and no random number drawn from either stream.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // The tag the forward's TP all-reduces are counted under (comm::CollectiveOptions::tag, static
  // storage); nullptr (the default) for training's.
  void set_collective_tag(const char* tag) { tag_ = tag; }

  // The dropout streams' states (at::Generator::get_state(): CPU uint8 tensors), copies.
  at::Tensor replicated_generator_state() const;
  at::Tensor local_generator_state() const;
  // Restores both streams from states of the same kind of generator. Throws c10::Error on a
  // state that is not one.
  void set_generator_states(const at::Tensor& replicated, const at::Tensor& local);

 private:
  at::Tensor Dropout(const at::Tensor& x, double p, at::Generator& gen);
  at::Tensor Attention(const at::Tensor& qkv, int64_t B, int64_t S);
  const at::Tensor& future_mask(int64_t S);

  ModelConfig cfg_;
  ParamStore* store_;
  comm::Group* tp_;
  int64_t local_heads_;
  bool training_ = true;
  const char* tag_ = nullptr;
  at::Generator replicated_gen_;
  at::Generator local_gen_;
  at::Tensor mask_;  // [S, S] bool, true above the diagonal (the future), cached for the last S
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_
