#include "worker/model/tp_layout.h"

namespace latchkey {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ParamLayout Replicated(std::string name, std::vector<int64_t> shape) {
  ParamLayout p;
  p.name = std::move(name);
  p.full_shape = shape;
  p.local_shape = std::move(shape);
  p.kind = ShardKind::kReplicated;
  return p;
}

ParamLayout Sharded(std::string name, std::vector<int64_t> shape, ShardKind kind, int dim, int tp,
                    int r) {
  ParamLayout p;
  p.name = std::move(name);
  p.full_shape = shape;
  p.local_shape = shape;
  p.kind = kind;
  p.shard_len = shape[dim] / tp;
  p.shard_begin = r * p.shard_len;
  p.local_shape[dim] = p.shard_len;
  return p;
}

}  // namespace

int64_t ParamLayout::local_numel() const { return Numel(local_shape); }
int64_t ParamLayout::full_numel() const { return Numel(full_shape); }

absl::StatusOr<std::vector<ParamLayout>> BuildTpLayout(const ModelConfig& m, int tp, int r) {
  if (absl::Status st = ValidateModelForTp(m, tp, /*has_partition_config=*/false); !st.ok()) {
    return st;
  }
  if (r < 0 || r >= tp) {
    return absl::InvalidArgumentError("tp_rank " + std::to_string(r) + " outside [0, " +
                                      std::to_string(tp) + ")");
  }
  const int64_t E = m.n_embd, H = m.n_head, D = m.head_dim(), I = m.inner(), V = m.vocab_size,
                P = m.n_positions;
  std::vector<ParamLayout> out;
  out.push_back(Replicated("transformer.wte.weight", {V, E}));
  out.push_back(Replicated("transformer.wpe.weight", {P, E}));
  for (int i = 0; i < m.n_layer; ++i) {
    const std::string pre = "transformer.h." + std::to_string(i) + ".";
    out.push_back(Replicated(pre + "ln_1.weight", {E}));
    out.push_back(Replicated(pre + "ln_1.bias", {E}));
    for (const char* suffix : {"weight", "bias"}) {
      const bool w = std::string(suffix) == "weight";
      const std::string name = pre + "attn.c_attn." + suffix;
      if (m.multi_query) {
        // Shard unit: query heads (n_head), never the single K/V head.
        std::vector<int64_t> full = w ? std::vector<int64_t>{E + 2 * D, E}
                                      : std::vector<int64_t>{E + 2 * D};
        ParamLayout p;
        p.name = name;
        p.full_shape = full;
        p.local_shape = full;
        p.kind = ShardKind::kCAttnMqa;
        p.shard_len = H / tp * D;
        p.shard_begin = r * p.shard_len;
        p.local_shape[0] = p.shard_len + 2 * D;
        p.kv_row_begin = p.shard_len;
        p.kv_rows = 2 * D;
        out.push_back(p);
      } else {
        // Interleaved [q_h; k_h; v_h] blocks of 3D rows: whole blocks of this rank's heads.
        std::vector<int64_t> full = w ? std::vector<int64_t>{3 * E, E}
                                      : std::vector<int64_t>{3 * E};
        out.push_back(Sharded(name, full, ShardKind::kRows, 0, tp, r));
      }
    }
    out.push_back(Sharded(pre + "attn.c_proj.weight", {E, E}, ShardKind::kCols, 1, tp, r));
    out.push_back(Replicated(pre + "attn.c_proj.bias", {E}));
    out.push_back(Replicated(pre + "ln_2.weight", {E}));
    out.push_back(Replicated(pre + "ln_2.bias", {E}));
    out.push_back(Sharded(pre + "mlp.c_fc.weight", {I, E}, ShardKind::kRows, 0, tp, r));
    out.push_back(Sharded(pre + "mlp.c_fc.bias", {I}, ShardKind::kRows, 0, tp, r));
    out.push_back(Sharded(pre + "mlp.c_proj.weight", {E, I}, ShardKind::kCols, 1, tp, r));
    out.push_back(Replicated(pre + "mlp.c_proj.bias", {E}));
  }
  out.push_back(Replicated("transformer.ln_f.weight", {E}));
  out.push_back(Replicated("transformer.ln_f.bias", {E}));
  return out;
}

}  // namespace latchkey
