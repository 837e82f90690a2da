// How GPTBigCode's HF parameters are laid out on one tensor-parallel rank: each parameter of the
// GptBigCodeParams table (gpt_bigcode_params.h) with the local shape its ShardKind gives rank r
// of tp (docs/model.md, "Tensor-parallel sharding"). Torch-free: shapes, shard kinds and which
// rows are replicated.
#ifndef LATCHKEY_WORKER_MODEL_TP_LAYOUT_H_
#define LATCHKEY_WORKER_MODEL_TP_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/model/gpt_bigcode_params.h"

namespace latchkey {

struct ParamLayout {
  std::string name;  // HF name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> full_shape;
  std::vector<int64_t> local_shape;
  ShardKind kind = ShardKind::kReplicated;
  // kCAttnMqa: the local tensor's dim-0 rows [kv_row_begin, kv_row_begin + kv_rows) are the K/V
  // rows (replicated values after the K/V reduction; partial gradients before it).
  int64_t kv_row_begin = 0;
  int64_t kv_rows = 0;
  // kRows / kCAttnMqa (query part) / kCols: the block [shard_begin, shard_begin + shard_len)
  // of the sharded dimension in the full tensor.
  int64_t shard_begin = 0;
  int64_t shard_len = 0;
  // A replicated parameter used inside the regions sequence parallelism shards along the
  // sequence (ln_1, ln_2, ln_f weights and biases; the row-parallel biases attn.c_proj.bias and
  // mlp.c_proj.bias): under tensor_parallel.sequence_parallel each TP rank sees only its S/tp
  // positions, so its gradient is partial and must be summed over TP like the K/V rows'.
  // Without sequence parallelism the flag changes nothing.
  bool sequence_parallel_partial = false;

  int64_t local_numel() const;
  int64_t full_numel() const;
  bool has_kv_rows() const { return kind == ShardKind::kCAttnMqa; }
};

struct FlatSegment {
  int64_t offset = 0;  // elements into the flat buffer
  int64_t length = 0;
  bool replicated = false;  // identical on every TP rank (after the K/V reduction)
  bool kv = false;          // the replicated K/V rows of an MQA c_attn weight or bias
  // Replicated, with a partial gradient per TP rank under sequence parallelism
  // (ParamLayout::sequence_parallel_partial).
  bool sequence_parallel_partial = false;
};

// Every parameter of the model in HF order (GptBigCodeParams: wte, wpe, h.0..h.L-1 in module
// order, ln_f). lm_head is tied to wte and not listed. Validates the TP rules
// (ValidateModelForTp) and 0 <= tp_rank < tp: INVALID_ARGUMENT otherwise. Marks the
// sequence-parallel partial parameters whatever the spec (the layout does not depend on it).
absl::StatusOr<std::vector<ParamLayout>> BuildTpLayout(const ModelConfig& model, int tp,
                                                       int tp_rank);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_TP_LAYOUT_H_
