// Where every value of a training state lives, in the logical (unsharded) index space of the
// model's parameters, for one layout (tp, dp, ZeRO stage, bf16, optimizer): the table a
// layout-independent checkpoint (latchkey-checkpoint/2, docs/fault-tolerance.md) is written
// from and read into. Torch-free and comm-free: every rank computes the same table from the
// same LayoutSpec, so rank 0 can name every rank's pieces without asking them.
//
// The logical tensors are, per HF parameter, `param` (the fp32 weights; in bf16 mode the fp32
// master, whose bf16 rounding is the compute copy), and with AdamW `exp_avg` and `exp_avg_sq`.
// A rank's local flat buffer (param_store.h: the concatenation of its TP-local tensors) is cut
// into blocks, each a contiguous flat range that maps row-major onto one rectangle of the
// global tensor (a kCAttnMqa tensor has two: the rank's query rows and the replicated K/V
// rows). What a rank holds of a logical tensor is a flat range (`HeldRange`): the whole buffer,
// or its ZeRO-1 partition for the master and the optimizer moments. A held range that cuts a
// block becomes up to three rectangles (partial row, full rows, partial row): the regions.
// Regions with the same (tensor, parameter, rectangle) on several ranks are replicas (TP
// replication, DP replication without ZeRO partitioning, fp32 weights all-gathered under
// ZeRO-1); each distinct region has one writer among its holders, chosen deterministically so
// that the bytes spread over every rank.
//
// Thread-safety: a built LayoutTable is immutable. Errors: INVALID_ARGUMENT naming the field.
#ifndef LATCHKEY_WORKER_CHECKPOINT_LOGICAL_LAYOUT_H_
#define LATCHKEY_WORKER_CHECKPOINT_LOGICAL_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/model/tp_layout.h"

namespace latchkey {

enum class TensorKind { kParam, kExpAvg, kExpAvgSq };
const char* TensorKindName(TensorKind k);  // "param", "exp_avg", "exp_avg_sq"
std::optional<TensorKind> ParseTensorKind(const std::string& name);

struct LayoutSpec {
  ModelConfig model;
  int tp = 1;
  int dp = 1;
  int zero_stage = 0;
  bool bf16 = false;
  bool adamw = false;  // AdamW's moments exist (SGD has none)

  int world() const { return tp * dp; }
  // ZeRO-1 (and 2, which partitions the optimizer state alike) partitions only over a parallel
  // DP group (the engine's rule). The engine's partition is checked against it at every save.
  bool zero1() const { return zero_stage >= 1 && dp > 1; }
};

// A rectangle of a parameter in global index space, as rows x cols (a 1-D tensor of n elements
// is n rows of one column).
struct Rect {
  int64_t row = 0;
  int64_t col = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows * cols; }
  bool operator==(const Rect& o) const {
    return row == o.row && col == o.col && rows == o.rows && cols == o.cols;
  }
  bool operator<(const Rect& o) const;
};

// The intersection of two rectangles (numel() 0 when they do not meet).
Rect Intersect(const Rect& a, const Rect& b);

// A contiguous stretch of a rank's local flat buffer: [flat_begin, flat_begin + rect.numel())
// holds `rect` of parameter `param` row-major.
struct Block {
  int param = 0;
  int64_t flat_begin = 0;
  Rect rect;
  bool tp_replicated = false;  // the same values on every TP rank
};

// One distinct region of a logical tensor and who holds it.
struct Region {
  TensorKind kind = TensorKind::kParam;
  int param = 0;
  Rect rect;
  int64_t flat_begin = 0;    // where it starts in every holder's local flat buffer
  std::vector<int> holders;  // global ranks, ascending
  int writer = 0;            // one of holders
};

class LayoutTable {
 public:
  // INVALID_ARGUMENT naming tensor_parallel / latchkey.world_size / zero_optimization.stage
  // when the model does not permit the layout.
  static absl::StatusOr<LayoutTable> Build(const LayoutSpec& spec);

  const LayoutSpec& spec() const { return spec_; }
  // Parameter i's HF name and global shape (HF order, GptBigCodeParams).
  const std::string& param_name(int i) const { return names_[i]; }
  const std::vector<int64_t>& global_shape(int i) const { return shapes_[i]; }
  int num_params() const { return static_cast<int>(names_.size()); }
  // The logical tensors of this layout: param, and exp_avg, exp_avg_sq with AdamW.
  std::vector<TensorKind> kinds() const;
  // Elements of a rank's local flat buffer (without the ZeRO padding): the same on every rank.
  int64_t numel() const { return numel_; }
  // The flat range [first, second) of its local buffer a rank holds of `kind` (numel() >= second).
  std::pair<int64_t, int64_t> HeldRange(int rank, TensorKind kind) const;
  // The blocks of TP rank r's local flat buffer, in flat order.
  const std::vector<Block>& blocks(int tp_rank) const { return blocks_[tp_rank]; }
  // Every distinct region, in canonical order (kind, param, rect).
  const std::vector<Region>& regions() const { return regions_; }
  // Indices into regions() of those `rank` holds, ascending.
  const std::vector<int>& held_by(int rank) const { return held_by_[rank]; }

  // The rectangles the flat range [begin, end) of TP rank r's buffer covers, each with the flat
  // offset where it starts: a block cut by the range becomes up to three.
  std::vector<std::pair<Block, int64_t>> Cover(int tp_rank, int64_t begin, int64_t end) const;

 private:
  LayoutSpec spec_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  int64_t numel_ = 0;
  std::vector<std::vector<Block>> blocks_;
  std::vector<Region> regions_;
  std::vector<std::vector<int>> held_by_;
};

// The key of a region's tensor in its writer's file: "<kind>/<param>@<row>,<col>".
std::string PieceKey(TensorKind kind, const std::string& param, const Rect& rect);

// The rectangle as the manifest writes it: offsets and shape in the tensor's own rank (1-D
// tensors one number each).
std::vector<int64_t> RectOffsets(const Rect& r, const std::vector<int64_t>& global_shape);
std::vector<int64_t> RectShape(const Rect& r, const std::vector<int64_t>& global_shape);
// The inverse; INVALID_ARGUMENT when they do not fit the global shape.
absl::StatusOr<Rect> RectFrom(const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& global_shape);

// Copies the part of `src` (row-major values of rectangle `src_rect`) that lies in `dst_rect`
// into `dst` (row-major values of `dst_rect`); returns the elements copied.
int64_t CopyRect(const float* src, const Rect& src_rect, float* dst, const Rect& dst_rect);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_LOGICAL_LAYOUT_H_
