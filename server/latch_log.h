// LatchLog: the published latches of one job, in window order. Part of the Coordinator's private
// implementation.
//
// Owns the publication rule (latch(s) = DecideLatch(spec, policy, s, M_s, first_sample_s),
// persisted with JobStore::AppendLatches before anything can read it, never changed afterwards),
// the position of the next window (s and M_s), and the in-memory cache of recent latches the
// streams read. Latches older than the cache, and all of an ended job's, are read back from the
// store: Read() is the only lookup, whichever place a latch is in.
//
// Layouts (docs/fault-tolerance.md "Elastic recovery"): the latches are decided for one layout
// (its dp, and the attempt that began it, which every published latch is stamped with). An
// attempt with a new layout Rewinds the log to the first window after its resume step: those
// windows are decided again, for the new layout, under the policy generation it begins; the
// old layout's latches stay stored and immutable, and the store serves the newest layout's.
//
// Thread-safety: none; the Coordinator holds its lock around every call. The JobStore passed to
// each call must be the one the job is stored in.
#ifndef LATCHKEY_SERVER_LATCH_LOG_H_
#define LATCHKEY_SERVER_LATCH_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "server/store.h"

namespace latchkey {

class LatchLog {
 public:
  // A job that has published nothing yet, or one whose latches [0, next_window) are in the store
  // (call Restore to serve them from memory).
  LatchLog(std::string job_id, int64_t next_window, int64_t next_first_micro_batch,
           int64_t next_first_sample)
      : job_id_(std::move(job_id)),
        next_window_(next_window),
        next_first_micro_batch_(next_first_micro_batch),
        next_first_sample_(next_first_sample),
        cache_base_(next_window) {}

  int64_t next_window() const { return next_window_; }                        // first unpublished
  int64_t next_first_micro_batch() const { return next_first_micro_batch_; }  // its M
  int64_t next_first_sample() const { return next_first_sample_; }            // its first_sample
  int64_t layout_attempt() const { return layout_attempt_; }

  // The layout the next latches are decided for: begun by attempt `layout_attempt`, `dp`
  // replicas (first_sample advances by n * dp * micro_batch_size per window).
  void SetLayout(int64_t layout_attempt, int dp) {
    layout_attempt_ = layout_attempt;
    dp_ = dp;
  }
  // A new layout decides windows from `first_window` (<= next_window()) on, the data position
  // there being M = `first_micro_batch` and `first_sample` samples. The caller persists the
  // position (JobStore::BeginAttempt) first. Cached latches from first_window on are dropped
  // (the old layout's stay in the store).
  void Rewind(int64_t first_window, int64_t first_micro_batch, int64_t first_sample);

  // Publishes windows [next_window(), frontier) under `policy`, persisting them first. Returns
  // the latches it published (empty when the frontier was reached already).
  // `split` (may be empty) gives each latch's micro-batches per DP replica (rebalancing); a
  // split the latch cannot carry (SplitProblem: e.g. a policy's mid-window DP reduction) is
  // left out: that window is even.
  using SplitFn = std::function<std::vector<int>(const Latch&)>;
  absl::StatusOr<std::vector<PublishedLatch>> Publish(JobStore& store, const JobSpec& spec,
                                                      const LatchPolicy& policy, int64_t frontier,
                                                      absl::Time now, const SplitFn& split = {});

  // Published latches from `window` on, at most `max`, from memory or the store.
  // REQUIRES: 0 <= window < next_window(), max >= 1.
  absl::StatusOr<std::vector<PublishedLatch>> Read(JobStore& store, int64_t window,
                                                   int64_t max) const;

  // Loads every published latch into memory (recovery), checking the store holds exactly
  // [0, next_window()) (per window the newest layout's). DATA_LOSS otherwise. REQUIRES:
  // SetLayout called with the current attempt's layout.
  absl::Status Restore(JobStore& store);
  // Drops cached latches before `window`; they stay readable from the store.
  void ForgetBefore(int64_t window);
  // Drops the whole cache (an ended job serves no stream).
  void ForgetAll();

 private:
  std::string job_id_;
  int64_t next_window_;
  int64_t next_first_micro_batch_;
  // Samples consumed before next_window_ (Latch::first_sample), persisted with the job.
  int64_t next_first_sample_;
  int64_t layout_attempt_ = 1;
  int dp_ = 1;
  // Latches [cache_base_, next_window_) in memory.
  std::deque<PublishedLatch> cache_;
  int64_t cache_base_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_LATCH_LOG_H_
