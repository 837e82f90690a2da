// The one table of GPTBigCodeForCausalLM's parameters: every HF tensor name, its full shape and
// how tensor parallelism splits it. The TP layout (tp_layout.h) and the HF checkpoint checks
// (worker/checkpoint/hf_checkpoint.h) both derive from it, so the two cannot disagree
// (docs/model.md, "Parameters").
//
// Torch-free. Thread-safety: pure functions, reentrant.
#ifndef LATCHKEY_WORKER_MODEL_GPT_BIGCODE_PARAMS_H_
#define LATCHKEY_WORKER_MODEL_GPT_BIGCODE_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace latchkey {

// How a parameter is split over the TP ranks.
enum class ShardKind {
  kReplicated,  // whole tensor on every TP rank (embeddings, LayerNorms, row-parallel biases)
  kRows,        // dim 0 block [r*n/tp, (r+1)*n/tp) (mlp.c_fc, MHA c_attn head blocks)
  kCols,        // dim 1 block (attn.c_proj and mlp.c_proj weights)
  kCAttnMqa,    // this rank's query rows, then the 2*D K/V rows replicated on every rank
};

struct GptBigCodeParam {
  std::string name;            // HF name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // full (unsharded) HF shape; Linear weights are [out, in]
  ShardKind split = ShardKind::kReplicated;
};

// lm_head's HF name. latchkey ties it to transformer.wte, so GptBigCodeParams omits it and a
// checkpoint may carry it or not.
inline constexpr char kTiedLmHeadName[] = "lm_head.weight";

// Every parameter in HF module order: wte, wpe, then for each layer ln_1, attn.c_attn
// (weight, bias), attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, and last ln_f. c_attn has
// n_embd + 2 * kv rows, kv = head_dim for multi_query (kCAttnMqa), n_embd otherwise (kRows over
// interleaved [q_h; k_h; v_h] head blocks).
// REQUIRES: config.n_head > 0 (the sizes are not otherwise validated).
std::vector<GptBigCodeParam> GptBigCodeParams(const ModelConfig& config);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_GPT_BIGCODE_PARAMS_H_
