// BoundaryArrivals: how far apart one job's ranks reach each window's boundary. Part of the
// Coordinator's private implementation; derived state, rebuilt on load from the stored (first)
// step reports.
//
// Each rank reports how long it waited at a window's boundary (StepReport::boundary_wait_seconds).
// Once every rank of the attempt reported a window, the rank that waited least arrived last: it
// is the window's slowest rank, and max - min of the waits is the window's lag. The last
// kSlowestKept windows' verdicts are kept for JobView::slowest (newest last).
//
// Thread-safety: none; the Coordinator holds its lock around every call.
#ifndef LATCHKEY_SERVER_BOUNDARY_ARRIVALS_H_
#define LATCHKEY_SERVER_BOUNDARY_ARRIVALS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "common/job_info.h"
#include "server/store.h"

namespace latchkey {

class BoundaryArrivals {
 public:
  static constexpr size_t kSlowestKept = 8;

  // Rank `rank`'s wait at the boundary of `window` (its first report of it in this attempt);
  // the window's verdict once all `world_size` ranks reported it.
  std::optional<WindowArrival> Note(int64_t window, int rank, double wait_seconds, int world_size);
  // A new attempt: the windows not every rank reported are forgotten (it re-runs them).
  void NewAttempt() { partial_.clear(); }
  // On load: the verdicts of the windows every one of `world_size` ranks reported in `reports`
  // (step order); with `keep_partial` (a live job in its first attempt) the waits of the others,
  // whose earlier reporters will not report them again.
  void Restore(const std::vector<StepReportRecord>& reports, int world_size, bool keep_partial);

  const std::deque<WindowArrival>& slowest() const { return slowest_; }

 private:
  void Keep(const WindowArrival& a);

  std::map<int64_t, std::map<int, double>> partial_;  // window -> rank -> wait
  std::deque<WindowArrival> slowest_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_BOUNDARY_ARRIVALS_H_
