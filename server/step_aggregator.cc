#include "server/step_aggregator.h"

#include <algorithm>

namespace latchkey {

void StepAggregator::Add(const StepReportRecord& record) {
  const StepReport& r = record.report;
  if (recent_.count(r.step)) return;
  Partial& p = partial_[r.step];
  p.count++;
  CompletedStep& sum = p.summary;
  StepReport& out = sum.report;
  out.step = r.step;
  out.step_seconds = std::max(out.step_seconds, r.step_seconds);
  out.peak_memory_bytes = std::max(out.peak_memory_bytes, r.peak_memory_bytes);
  sum.rank_peak_memory_bytes[record.rank] = r.peak_memory_bytes;
  if (record.collective_seconds_stored) {
    sum.rank_collective_share[record.rank] =
        r.step_seconds > 0 ? r.collective_seconds / r.step_seconds : 0.0;
  }
  if (r.replica_micro_batches > 0) {
    sum.rank_compute_per_micro_batch[record.rank] = r.compute_seconds / r.replica_micro_batches;
  }
  sum.ranks_reported = p.count;
  if (record.rank == 0 || p.count == 1) {
    out.micro_batches = r.micro_batches;
    out.loss = r.loss;
    out.grad_norm = r.grad_norm;
    out.kv_mode = r.kv_mode;
    out.kv_allreduce_calls = r.kv_allreduce_calls;
    out.replicated_allreduce_calls = r.replicated_allreduce_calls;
    out.tokens = r.tokens;
    out.lr = r.lr;
    out.eval_loss = r.eval_loss;
  }
  if (p.count < world_size_) return;
  recent_[r.step] = sum;
  if (sum.report.eval_loss && (!last_eval_ || last_eval_->report.step < r.step)) last_eval_ = sum;
  partial_.erase(r.step);
  while (recent_.size() > std::max<size_t>(1, keep_)) recent_.erase(recent_.begin());
}

std::vector<CompletedStep> StepAggregator::After(int64_t after_step) const {
  std::vector<CompletedStep> out;
  for (auto it = recent_.upper_bound(after_step); it != recent_.end(); ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::optional<CompletedStep> StepAggregator::Last() const {
  if (recent_.empty()) return std::nullopt;
  return recent_.rbegin()->second;
}

}  // namespace latchkey
