#include "worker/checkpoint/logical_layout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// A parameter's shape as rows x cols (1-D: n x 1).
std::pair<int64_t, int64_t> Dims2(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return {shape[0], 1};
  return {shape[0], shape.size() > 1 ? shape[1] : 1};
}

// The blocks of one TP rank's local tensors (tp_layout.h), in flat order.
std::vector<Block> BlocksOf(const std::vector<ParamLayout>& layout) {
  std::vector<Block> out;
  int64_t offset = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamLayout& p = layout[i];
    const auto [rows, cols] = Dims2(p.local_shape);
    const int param = static_cast<int>(i);
    switch (p.kind) {
      case ShardKind::kReplicated:
        out.push_back({param, offset, {0, 0, rows, cols}, true});
        break;
      case ShardKind::kRows:
        out.push_back({param, offset, {p.shard_begin, 0, rows, cols}, false});
        break;
      case ShardKind::kCols:
        out.push_back({param, offset, {0, p.shard_begin, rows, cols}, false});
        break;
      case ShardKind::kCAttnMqa: {
        // The query rows of this rank's heads, then the K/V rows that follow every query row
        // of the full tensor (global rows [E, E + 2D)).
        const int64_t kv_global = p.full_shape[0] - p.kv_rows;
        out.push_back({param, offset, {p.shard_begin, 0, p.shard_len, cols}, false});
        out.push_back(
            {param, offset + p.kv_row_begin * cols, {kv_global, 0, p.kv_rows, cols}, true});
        break;
      }
    }
    offset += p.local_numel();
  }
  return out;
}

}  // namespace

const char* TensorKindName(TensorKind k) {
  switch (k) {
    case TensorKind::kParam:
      return "param";
    case TensorKind::kExpAvg:
      return "exp_avg";
    case TensorKind::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

std::optional<TensorKind> ParseTensorKind(const std::string& name) {
  for (TensorKind k : {TensorKind::kParam, TensorKind::kExpAvg, TensorKind::kExpAvgSq}) {
    if (name == TensorKindName(k)) return k;
  }
  return std::nullopt;
}

bool Rect::operator<(const Rect& o) const {
  return std::tie(row, col, rows, cols) < std::tie(o.row, o.col, o.rows, o.cols);
}

Rect Intersect(const Rect& a, const Rect& b) {
  const int64_t r0 = std::max(a.row, b.row), r1 = std::min(a.row + a.rows, b.row + b.rows);
  const int64_t c0 = std::max(a.col, b.col), c1 = std::min(a.col + a.cols, b.col + b.cols);
  if (r1 <= r0 || c1 <= c0) return {};
  return {r0, c0, r1 - r0, c1 - c0};
}

absl::StatusOr<LayoutTable> LayoutTable::Build(const LayoutSpec& spec) {
  if (spec.tp < 1) return absl::InvalidArgumentError("tensor_parallel.autotp_size: must be >= 1");
  if (spec.dp < 1) return absl::InvalidArgumentError("latchkey.world_size: dp must be >= 1");
  if (spec.zero_stage < 0 || spec.zero_stage > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero_optimization.stage: ", spec.zero_stage, " has no checkpoint layout"));
  }
  LayoutTable t;
  t.spec_ = spec;
  for (int r = 0; r < spec.tp; ++r) {
    absl::StatusOr<std::vector<ParamLayout>> layout = BuildTpLayout(spec.model, spec.tp, r);
    if (!layout.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor_parallel.autotp_size: ", layout.status().message()));
    }
    if (r == 0) {
      for (const ParamLayout& p : *layout) {
        t.names_.push_back(p.name);
        t.shapes_.push_back(p.full_shape);
        t.numel_ += p.local_numel();
      }
    }
    t.blocks_.push_back(BlocksOf(*layout));
  }
  // Every rank's regions, grouped by what they hold.
  std::map<std::tuple<int, int, Rect>, int> index;
  t.held_by_.resize(spec.world());
  for (TensorKind kind : t.kinds()) {
    for (int rank = 0; rank < spec.world(); ++rank) {
      const auto [begin, end] = t.HeldRange(rank, kind);
      for (const auto& [block, flat] : t.Cover(rank % spec.tp, begin, end)) {
        const auto key = std::make_tuple(static_cast<int>(kind), block.param, block.rect);
        auto [it, fresh] = index.emplace(key, 0);
        if (fresh) {
          it->second = static_cast<int>(t.regions_.size());
          t.regions_.push_back({kind, block.param, block.rect, flat, {}, 0});
        }
        t.regions_[it->second].holders.push_back(rank);
      }
    }
  }
  // Canonical order, then one writer per region: the least loaded holder so far (the bytes
  // spread over DP and TP; the same choice on every rank).
  std::sort(t.regions_.begin(), t.regions_.end(), [](const Region& a, const Region& b) {
    return std::tie(a.kind, a.param, a.rect) < std::tie(b.kind, b.param, b.rect);
  });
  std::vector<int64_t> load(spec.world(), 0);
  for (size_t i = 0; i < t.regions_.size(); ++i) {
    Region& r = t.regions_[i];
    int best = r.holders[0];
    for (int h : r.holders) {
      if (load[h] < load[best]) best = h;
    }
    r.writer = best;
    load[best] += r.rect.numel();
    for (int h : r.holders) t.held_by_[h].push_back(static_cast<int>(i));
  }
  return t;
}

std::vector<TensorKind> LayoutTable::kinds() const {
  if (!spec_.adamw) return {TensorKind::kParam};
  return {TensorKind::kParam, TensorKind::kExpAvg, TensorKind::kExpAvgSq};
}

std::pair<int64_t, int64_t> LayoutTable::HeldRange(int rank, TensorKind kind) const {
  // fp32 weights are all-gathered after every ZeRO-1 step: every rank holds all of them.
  const bool partitioned = spec_.zero1() && (kind != TensorKind::kParam || spec_.bf16);
  if (!partitioned) return {0, numel_};
  // The engine's partition: 1/dp of the buffer padded to roundup(numel + 1, dp).
  const int64_t padded = (numel_ + 1 + spec_.dp - 1) / spec_.dp * spec_.dp;
  const int64_t chunk = padded / spec_.dp;
  const int64_t begin = (rank / spec_.tp) * chunk;
  return {std::min(begin, numel_), std::min(begin + chunk, numel_)};
}

std::vector<std::pair<Block, int64_t>> LayoutTable::Cover(int tp_rank, int64_t begin,
                                                          int64_t end) const {
  std::vector<std::pair<Block, int64_t>> out;
  for (const Block& b : blocks_[tp_rank]) {
    const int64_t lo = std::max(begin, b.flat_begin);
    const int64_t hi = std::min(end, b.flat_begin + b.rect.numel());
    const int64_t cols = b.rect.cols;
    for (int64_t o = lo - b.flat_begin; o < hi - b.flat_begin;) {
      const int64_t r = o / cols, c = o % cols, left = hi - b.flat_begin - o;
      Block piece = b;
      if (c != 0 || left < cols) {  // a partial row
        const int64_t n = std::min(cols - c, left);
        piece.rect = {b.rect.row + r, b.rect.col + c, 1, n};
      } else {  // full rows
        piece.rect = {b.rect.row + r, b.rect.col, left / cols, cols};
      }
      piece.flat_begin = b.flat_begin + o;
      out.emplace_back(piece, piece.flat_begin);
      o += piece.rect.numel();
    }
  }
  return out;
}

std::string PieceKey(TensorKind kind, const std::string& param, const Rect& rect) {
  return absl::StrCat(TensorKindName(kind), "/", param, "@", rect.row, ",", rect.col);
}

std::vector<int64_t> RectOffsets(const Rect& r, const std::vector<int64_t>& global_shape) {
  if (global_shape.size() == 1) return {r.row};
  return {r.row, r.col};
}

std::vector<int64_t> RectShape(const Rect& r, const std::vector<int64_t>& global_shape) {
  if (global_shape.size() == 1) return {r.rows};
  return {r.rows, r.cols};
}

absl::StatusOr<Rect> RectFrom(const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& global_shape) {
  if (offsets.size() != global_shape.size() || shape.size() != global_shape.size() ||
      global_shape.empty() || global_shape.size() > 2) {
    return absl::InvalidArgumentError("offsets/shape do not have the tensor's rank");
  }
  Rect r{offsets[0], 0, shape[0], 1};
  if (global_shape.size() == 2) {
    r.col = offsets[1];
    r.cols = shape[1];
  }
  const auto [rows, cols] = Dims2(global_shape);
  if (r.row < 0 || r.col < 0 || r.rows < 1 || r.cols < 1 || r.row + r.rows > rows ||
      r.col + r.cols > cols) {
    return absl::InvalidArgumentError("piece lies outside the tensor");
  }
  return r;
}

int64_t CopyRect(const float* src, const Rect& src_rect, float* dst, const Rect& dst_rect) {
  const Rect i = Intersect(src_rect, dst_rect);
  for (int64_t row = i.row; row < i.row + i.rows; ++row) {
    const float* from = src + (row - src_rect.row) * src_rect.cols + (i.col - src_rect.col);
    float* to = dst + (row - dst_rect.row) * dst_rect.cols + (i.col - dst_rect.col);
    std::memcpy(to, from, i.cols * sizeof(float));
  }
  return i.numel();
}

}  // namespace latchkey
