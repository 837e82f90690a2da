// Summary statistics the benchmarks print: the true median (the mean of the two middle values
// for an even count) and the min-max spread.
#ifndef LATCHKEY_BENCH_STATS_H_
#define LATCHKEY_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace latchkey::bench {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double Min(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

inline double Max(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_STATS_H_
