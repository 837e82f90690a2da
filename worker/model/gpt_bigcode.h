// GPTBigCode (HF transformers math, docs/model.md) over one tensor-parallel shard.
//
// With tp > 1 the forward issues 2 all-reduces per layer (after attn.c_proj and mlp.c_proj, the
// row-parallel matmuls) and the backward 2 (input gradients of c_attn and c_fc), through the TP
// group. The replicated K/V gradient is NOT reduced here: that is the KvReducer's job.
// With sequence parallelism (tp > 1) the embedding output is split along the sequence (rank r
// keeps positions [r·S/tp, (r+1)·S/tp)); LayerNorm, dropout and the residual adds work on
// [B, S/tp, E]; each column-parallel matmul (c_attn, c_fc) all-gathers its input along the
// sequence (backward: the input gradient reduce-scattered, the input all-gathered again for the
// weight gradient), each row-parallel output (attn.c_proj, mlp.c_proj) is reduce-scattered
// (backward: all-gathered) instead of all-reduced, and the ln_f output is all-gathered before the
// logits. The LayerNorm and row-parallel bias gradients are then partial per TP rank (the
// KvReducer sums them, with the K/V rows). seq_len must be divisible by tp (c10::Error).
// A TP collective that fails (inside Loss/Logits or inside autograd's backward()) throws
// comm::CollectiveError carrying the collective's Status; nothing else is caught here.
// Dropout (training only, p > 0) draws its masks from the Philox streams of philox.h on the
// parameters' device: every element is a function of (seed, the row's stream position, layer,
// site, global head, element position), so every TP/DP layout draws the same masks.
// Activation recomputation (set_activation_checkpointing, docs/memory.md) applies only while
// training with grad mode on: `selective` recomputes CoreAttention in backward, `full` keeps
// only the input of each group of `every_layers` layers and recomputes the group, re-issuing its
// forward TP all-reduces. The replay draws the same dropout masks, so gradients are unchanged.
// Thread-safety: one thread at a time. Lifetime: `store` and `tp_group` outlive the model.
#ifndef LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_
#define LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "common/job_spec.h"
#include "worker/comm/comm.h"
#include "worker/model/param_store.h"
#include "worker/model/philox.h"

namespace latchkey {

class GptBigCode {
 public:
  // `dropout_seed` keys the dropout streams (latchkey.seed); nothing else about them is state.
  // `sequence_parallel` (tensor_parallel.sequence_parallel) takes effect only with a parallel
  // TP group.
  GptBigCode(const ModelConfig& config, ParamStore* store, comm::Group* tp_group,
             uint64_t dropout_seed, bool sequence_parallel = false);

  // input_ids, labels: [B, S] int64 on the store's device; row_positions: the stream position of
  // each of the B rows (docs/data.md: not wrapped modulo the data size), which selects its dropout
  // masks. Returns the mean cross entropy over all B*S positions. Throws c10::Error when
  // row_positions does not hold B entries >= 0.
  at::Tensor Loss(const at::Tensor& input_ids, const at::Tensor& labels,
                  const std::vector<int64_t>& row_positions);
  // [B, S, vocab] logits.
  at::Tensor Logits(const at::Tensor& input_ids, const std::vector<int64_t>& row_positions);

  // false: no dropout, and no mask drawn.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // The tag the forward's TP all-reduces are counted under (comm::CollectiveOptions::tag, static
  // storage); nullptr (the default) for training's.
  void set_collective_tag(const char* tag) { tag_ = tag; }
  // latchkey.activation_checkpointing (mode none by default). every_layers >= 1.
  void set_activation_checkpointing(const ActivationCheckpointingConfig& c) { recompute_ = c; }

 private:
  // x [B, ...] with p in (0, 1) while training: x · keep / (1 − p) with the keep mask of
  // (site, layer) for the rows at positions_; x itself otherwise.
  at::Tensor Dropout(const at::Tensor& x, double p, philox::DropoutSite site, int64_t layer);
  // Transformer block `layer`: x [B, S, E] -> x [B, S, E], with its 2 TP all-reduces forward
  // (sequence parallelism: [B, S/tp, E] -> [B, S/tp, E], 2 all-gathers and 2 reduce-scatters).
  at::Tensor Layer(const at::Tensor& x, int64_t layer);
  // qkv [B, S, local width] -> [B, S, Hl*D]: splits the heads and runs CoreAttention.
  at::Tensor Attention(const at::Tensor& qkv, int64_t B, int64_t S, int64_t layer);
  // q [B,Hl,S,D], k/v [B,Hl or 1,S,D] -> [B,Hl,S,D]: scores, causal mask, softmax, attention
  // dropout, probabilities·V. No parameters and no collectives.
  at::Tensor CoreAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t layer);
  const at::Tensor& future_mask(int64_t S);
  // True when `mode` is the configured recomputation and it applies: training, grad mode on.
  bool Recomputing(RecomputeMode mode) const;
  // What a recomputed function runs under, in its forward and in its replay in backward: the row
  // positions of the forward that recorded it (its dropout masks) and training on; the model's
  // own are restored on exit.
  class ReplayScope {
   public:
    ReplayScope(GptBigCode* model, at::Tensor positions);
    ~ReplayScope();
    ReplayScope(const ReplayScope&) = delete;
    ReplayScope& operator=(const ReplayScope&) = delete;

   private:
    GptBigCode* model_;
    at::Tensor positions_;
    bool training_;
  };

  ModelConfig cfg_;
  ParamStore* store_;
  comm::Group* tp_;
  bool sp_;  // sequence parallelism over a parallel tp_
  int64_t local_heads_;
  int64_t first_head_;  // the global index of this rank's first query head
  uint64_t dropout_seed_;
  bool training_ = true;
  const char* tag_ = nullptr;
  ActivationCheckpointingConfig recompute_;
  at::Tensor positions_;  // int64 [B] on the device: the forward's row positions (dropout only)
  at::Tensor mask_;  // [S, S] bool, true above the diagonal (the future), cached for the last S
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_GPT_BIGCODE_H_
