#include "worker/model/tp_layout.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/validate_job_spec.h"

namespace latchkey {
namespace {

// The replicated parameters of the regions sequence parallelism shards: LayerNorms and the
// row-parallel biases (added after the reduce-scatter, on the rank's positions only).
bool SequenceParallelPartial(const std::string& name) {
  for (const char* suffix : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "ln_f.weight",
                             "ln_f.bias", "attn.c_proj.bias", "mlp.c_proj.bias"}) {
    const std::string s(suffix);
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return true;
    }
  }
  return false;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Block r of tp along `dim`.
void ShardDim(int dim, int tp, int r, ParamLayout* p) {
  p->shard_len = p->full_shape[dim] / tp;
  p->shard_begin = r * p->shard_len;
  p->local_shape[dim] = p->shard_len;
}

}  // namespace

int64_t ParamLayout::local_numel() const { return Numel(local_shape); }
int64_t ParamLayout::full_numel() const { return Numel(full_shape); }

absl::StatusOr<std::vector<ParamLayout>> BuildTpLayout(const ModelConfig& m, int tp, int r) {
  LK_RETURN_IF_ERROR(ValidateModelForTp(m, tp, /*has_partition_config=*/false));
  if (r < 0 || r >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank ", r, " outside [0, ", tp, ")"));
  }
  const int64_t H = m.n_head, D = m.head_dim();
  std::vector<ParamLayout> out;
  for (GptBigCodeParam& param : GptBigCodeParams(m)) {
    ParamLayout p;
    p.name = std::move(param.name);
    p.full_shape = param.shape;
    p.local_shape = std::move(param.shape);
    p.kind = param.split;
    p.sequence_parallel_partial =
        p.kind == ShardKind::kReplicated && SequenceParallelPartial(p.name);
    switch (param.split) {
      case ShardKind::kReplicated:
        break;
      case ShardKind::kRows:
        // MHA c_attn: interleaved [q_h; k_h; v_h] blocks of 3D rows, so a block of rows is
        // whole heads of this rank.
        ShardDim(0, tp, r, &p);
        break;
      case ShardKind::kCols:
        ShardDim(1, tp, r, &p);
        break;
      case ShardKind::kCAttnMqa:
        // Shard unit: query heads (n_head), never the single K/V head.
        p.shard_len = H / tp * D;
        p.shard_begin = r * p.shard_len;
        p.local_shape[0] = p.shard_len + 2 * D;
        p.kv_row_begin = p.shard_len;
        p.kv_rows = 2 * D;
        break;
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace latchkey
