#include "worker/train/grad_norm.h"

#include <algorithm>

namespace latchkey {

std::vector<FlatRange> NormRanges(const std::vector<FlatSegment>& segments, int64_t begin,
                                  int64_t end, bool count_replicated) {
  std::vector<FlatRange> out;
  for (const FlatSegment& s : segments) {
    if (s.replicated && !count_replicated) continue;
    const int64_t lo = std::max(begin, s.offset);
    const int64_t hi = std::min(end, s.offset + s.length);
    if (hi > lo) out.push_back({lo, hi - lo});
  }
  return out;
}

double LocalGradNormSq(const FlatOps& ops, const at::Tensor& grads,
                       const std::vector<FlatSegment>& segments, int64_t begin, int64_t end,
                       bool count_replicated) {
  return ops.SumSquares(grads, NormRanges(segments, begin, end, count_replicated));
}

double PartitionGradNormSq(const FlatOps& ops, const at::Tensor& part,
                           const std::vector<FlatSegment>& segments, int64_t begin, int64_t end,
                           bool count_replicated) {
  std::vector<FlatRange> ranges = NormRanges(segments, begin, end, count_replicated);
  for (FlatRange& r : ranges) r.offset -= begin;
  return ops.SumSquares(part, ranges);
}

double ClipCoefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace latchkey
