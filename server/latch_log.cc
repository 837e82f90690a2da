#include "server/latch_log.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latchkey {

absl::StatusOr<std::vector<PublishedLatch>> LatchLog::Publish(JobStore& store, const JobSpec& spec,
                                                              const LatchPolicy& policy,
                                                              int64_t frontier, absl::Time now,
                                                              const SplitFn& split) {
  std::vector<PublishedLatch> batch;
  if (next_window_ >= frontier) return batch;
  int64_t m = next_first_micro_batch_;
  int64_t first_sample = next_first_sample_;
  // The store keeps microseconds: serve exactly what a restarted coordinator will read back.
  now = absl::FromUnixMicros(absl::ToUnixMicros(now));
  for (int64_t w = next_window_; w < frontier; ++w) {
    PublishedLatch p;
    p.latch = DecideLatch(spec, policy, w, m, first_sample);
    p.latch.job_id = job_id_;
    p.publish_time = now;
    p.layout_attempt = layout_attempt_;
    if (split) {
      std::vector<int> counts = split(p.latch);
      if (!counts.empty() && SplitProblem(p.latch, dp_, counts).empty()) {
        p.latch.replica_micro_batches = std::move(counts);
      }
    }
    m += p.latch.n;
    // The layout's dp, not the spec's: an elastic layout keeps the global batch with fewer
    // replicas and more micro-batches.
    first_sample += static_cast<int64_t>(p.latch.n) * dp_ * spec.micro_batch_size;
    batch.push_back(std::move(p));
  }
  // Persist first: nothing is visible to a stream until it is durable.
  LK_RETURN_IF_ERROR(store.AppendLatches(job_id_, batch, frontier, m, first_sample));
  cache_.insert(cache_.end(), batch.begin(), batch.end());
  next_window_ = frontier;
  next_first_micro_batch_ = m;
  next_first_sample_ = first_sample;
  return batch;
}

absl::StatusOr<std::vector<PublishedLatch>> LatchLog::Read(JobStore& store, int64_t window,
                                                           int64_t max) const {
  const int64_t end = std::min(next_window_, window + std::max<int64_t>(1, max));
  if (window >= cache_base_) {
    std::vector<PublishedLatch> out;
    for (int64_t w = window; w < end; ++w)
      out.push_back(cache_[static_cast<size_t>(w - cache_base_)]);
    return out;
  }
  LK_ASSIGN_OR_RETURN(std::vector<PublishedLatch> stored,
                      store.LoadLatches(job_id_, window, end - window));
  // A published window the store no longer has is a damaged database, not a "not yet".
  if (static_cast<int64_t>(stored.size()) != end - window ||
      (!stored.empty() && stored.front().latch.window != window)) {
    return absl::DataLossError(absl::StrCat(job_id_, ": latches [", window, ", ", end,
                                            ") were published but ", stored.size(), " are stored"));
  }
  return stored;
}

absl::Status LatchLog::Restore(JobStore& store) {
  // One more than published: a latch stored past next_window is damaged unless a newer layout
  // rewound the log before it (then it is an old layout's, immutable, and no longer counts).
  LK_ASSIGN_OR_RETURN(std::vector<PublishedLatch> all,
                      store.LoadLatches(job_id_, 0, next_window_ + 1));
  if (all.size() > static_cast<size_t>(next_window_) &&
      all.back().layout_attempt < layout_attempt_ && layout_attempt_ > 1) {
    all.pop_back();
  }
  if (static_cast<int64_t>(all.size()) != next_window_) {
    return absl::DataLossError(absl::StrCat(job_id_, ": ", all.size(),
                                            " latches stored but next_window is ", next_window_));
  }
  cache_.assign(std::make_move_iterator(all.begin()), std::make_move_iterator(all.end()));
  cache_base_ = 0;
  return absl::OkStatus();
}

void LatchLog::Rewind(int64_t first_window, int64_t first_micro_batch, int64_t first_sample) {
  if (first_window <= cache_base_) {
    cache_.clear();
    cache_base_ = first_window;
  } else if (first_window < next_window_) {
    cache_.resize(static_cast<size_t>(first_window - cache_base_));
  }
  next_window_ = first_window;
  next_first_micro_batch_ = first_micro_batch;
  next_first_sample_ = first_sample;
}

void LatchLog::ForgetBefore(int64_t window) {
  while (!cache_.empty() && cache_base_ < window) {
    cache_.pop_front();
    cache_base_++;
  }
}

void LatchLog::ForgetAll() {
  cache_.clear();
  cache_.shrink_to_fit();  // std::deque: releases its blocks
  cache_base_ = next_window_;
}

}  // namespace latchkey
