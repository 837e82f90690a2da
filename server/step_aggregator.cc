#include "server/step_aggregator.h"

#include <algorithm>

namespace latchkey {

void StepAggregator::Add(const StepReportRecord& record) {
  const StepReport& r = record.report;
  if (recent_.count(r.step)) return;
  Partial& p = partial_[r.step];
  p.count++;
  StepSummary& sum = p.summary;
  sum.step = r.step;
  sum.step_seconds = std::max(sum.step_seconds, r.step_seconds);
  sum.ranks_reported = p.count;
  if (record.rank == 0 || p.count == 1) {
    sum.micro_batches = r.micro_batches;
    sum.loss = r.loss;
    sum.grad_norm = r.grad_norm;
    sum.kv_mode = r.kv_mode;
    sum.kv_allreduce_calls = r.kv_allreduce_calls;
    sum.tokens = r.tokens;
  }
  if (p.count < world_size_) return;
  recent_[r.step] = sum;
  partial_.erase(r.step);
  while (recent_.size() > std::max<size_t>(1, keep_)) recent_.erase(recent_.begin());
}

std::vector<StepSummary> StepAggregator::After(int64_t after_step) const {
  std::vector<StepSummary> out;
  for (auto it = recent_.upper_bound(after_step); it != recent_.end(); ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::optional<StepSummary> StepAggregator::Last() const {
  if (recent_.empty()) return std::nullopt;
  return recent_.rbegin()->second;
}

}  // namespace latchkey
