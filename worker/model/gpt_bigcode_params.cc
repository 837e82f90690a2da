#include "worker/model/gpt_bigcode_params.h"

#include "absl/strings/str_cat.h"

namespace latchkey {

std::vector<GptBigCodeParam> GptBigCodeParams(const ModelConfig& c) {
  const int64_t e = c.n_embd;
  const int64_t kv = c.multi_query ? c.head_dim() : c.n_embd;
  const int64_t inner = c.inner();
  const ShardKind c_attn = c.multi_query ? ShardKind::kCAttnMqa : ShardKind::kRows;
  using K = ShardKind;
  std::vector<GptBigCodeParam> out;
  out.push_back({"transformer.wte.weight", {c.vocab_size, e}, K::kReplicated});
  out.push_back({"transformer.wpe.weight", {c.n_positions, e}, K::kReplicated});
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    out.push_back({p + "ln_1.weight", {e}, K::kReplicated});
    out.push_back({p + "ln_1.bias", {e}, K::kReplicated});
    out.push_back({p + "attn.c_attn.weight", {e + 2 * kv, e}, c_attn});
    out.push_back({p + "attn.c_attn.bias", {e + 2 * kv}, c_attn});
    out.push_back({p + "attn.c_proj.weight", {e, e}, K::kCols});
    out.push_back({p + "attn.c_proj.bias", {e}, K::kReplicated});
    out.push_back({p + "ln_2.weight", {e}, K::kReplicated});
    out.push_back({p + "ln_2.bias", {e}, K::kReplicated});
    out.push_back({p + "mlp.c_fc.weight", {inner, e}, K::kRows});
    out.push_back({p + "mlp.c_fc.bias", {inner}, K::kRows});
    out.push_back({p + "mlp.c_proj.weight", {e, inner}, K::kCols});
    out.push_back({p + "mlp.c_proj.bias", {e}, K::kReplicated});
  }
  out.push_back({"transformer.ln_f.weight", {e}, K::kReplicated});
  out.push_back({"transformer.ln_f.bias", {e}, K::kReplicated});
  return out;
}

}  // namespace latchkey
