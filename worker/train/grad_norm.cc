#include "worker/train/grad_norm.h"

#include <algorithm>

namespace latchkey {

double LocalGradNormSq(const float* grads, const std::vector<FlatSegment>& segments, int64_t begin,
                       int64_t end, bool count_replicated) {
  double total = 0.0;
  for (const FlatSegment& s : segments) {
    if (s.replicated && !count_replicated) continue;
    const int64_t lo = std::max(begin, s.offset);
    const int64_t hi = std::min(end, s.offset + s.length);
    double acc = 0.0;
    for (int64_t i = lo; i < hi; ++i) acc += static_cast<double>(grads[i]) * grads[i];
    total += acc;
  }
  return total;
}

double ClipCoefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace latchkey
