// StepAggregator: folds the ranks' reports of one job's steps into one CompletedStep per step once
// every rank has reported it, and keeps the last few for watchers. Part of the Coordinator's
// private implementation; durable reports live in the JobStore, this is derived state that
// recovery rebuilds by feeding the stored reports back in.
//
// Thread-safety: none; the Coordinator holds its lock around every call.
#ifndef LATCHKEY_SERVER_STEP_AGGREGATOR_H_
#define LATCHKEY_SERVER_STEP_AGGREGATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "server/coordinator.h"
#include "server/store.h"

namespace latchkey {

class StepAggregator {
 public:
  // `keep`: completed summaries kept (at least 1).
  StepAggregator(int world_size, size_t keep) : world_size_(world_size), keep_(keep) {}

  // Counts one rank's first report of a step. Rank 0's loss, lr, eval_loss, tokens and counts
  // stand for the step; step_seconds is the slowest rank's, peak_memory_bytes the largest.
  void Add(const StepReportRecord& record);
  // Forgets steps not every rank has reported (the job ended).
  void DropPartial() { partial_.clear(); }

  // Completed summaries after `after_step`, in step order.
  std::vector<CompletedStep> After(int64_t after_step) const;
  std::optional<CompletedStep> Last() const;
  // The newest completed step that evaluated (eval_loss set), kept whatever `keep` drops.
  const std::optional<CompletedStep>& LastEval() const { return last_eval_; }

 private:
  struct Partial {
    int count = 0;
    CompletedStep summary;
  };
  int world_size_;
  size_t keep_;
  std::map<int64_t, Partial> partial_;
  std::map<int64_t, CompletedStep> recent_;
  std::optional<CompletedStep> last_eval_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_STEP_AGGREGATOR_H_
