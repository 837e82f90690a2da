#include "server/boundary_arrivals.h"

#include <algorithm>
#include <set>

namespace latchkey {
namespace {

// One window's arrival from every rank's boundary wait: the rank that waited least arrived last
// (the lowest rank among equals); the lag is max - min.
WindowArrival Spread(int64_t window, const std::map<int, double>& waits) {
  int slowest = waits.begin()->first;
  double lo = waits.begin()->second;
  double hi = lo;
  for (const auto& [r, w] : waits) {
    if (w < lo) {
      lo = w;
      slowest = r;
    }
    hi = std::max(hi, w);
  }
  return WindowArrival{window, slowest, hi - lo};
}

}  // namespace

void BoundaryArrivals::Keep(const WindowArrival& a) {
  slowest_.push_back(a);
  while (slowest_.size() > kSlowestKept) slowest_.pop_front();
}

std::optional<WindowArrival> BoundaryArrivals::Note(int64_t window, int rank, double wait_seconds,
                                                    int world_size) {
  std::map<int, double>& waits = partial_[window];
  waits[rank] = wait_seconds;
  if (static_cast<int>(waits.size()) < world_size) return std::nullopt;
  const WindowArrival a = Spread(window, waits);
  partial_.erase(window);
  Keep(a);
  return a;
}

void BoundaryArrivals::Restore(const std::vector<StepReportRecord>& reports, int world_size,
                               bool keep_partial) {
  std::map<int64_t, std::map<int, double>> windows;
  std::set<int64_t> unknown;  // a rank's report was stored before schema v4 kept its wait
  for (const StepReportRecord& r : reports) {
    if (!r.boundary_wait_stored) unknown.insert(r.report.step);
    windows[r.report.step][r.rank] = r.report.boundary_wait_seconds;
  }
  slowest_.clear();
  partial_.clear();
  for (const auto& [window, waits] : windows) {
    if (unknown.count(window)) continue;
    if (static_cast<int>(waits.size()) == world_size) {
      Keep(Spread(window, waits));
    } else if (keep_partial) {
      partial_[window] = waits;
    }
  }
}

}  // namespace latchkey
