#include "server/attempt_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_info.h"

namespace latchkey {

AttemptLayout SpecLayout(const JobSpec& spec) {
  AttemptLayout out;
  // The placeholder spec of an unparsable job may say 0: its table still needs one rank.
  out.world_size = std::max(1, spec.world_size);
  out.tp = std::max(1, spec.tp);
  out.dp = out.world_size / out.tp;
  out.gradient_accumulation_steps = spec.gradient_accumulation_steps;
  return out;
}

AttemptLog::AttemptLog(const JobRecord& record, const AttemptLayout& spec_layout, int min_dp,
                       const std::vector<AttemptRecord>& stored)
    : spec_layout_(spec_layout), min_dp_(min_dp) {
  // Attempts 1 .. record.attempt, each from its record where there is one; the current one's
  // resume point and cause are the job record's (written with it in one transaction).
  std::map<int64_t, const AttemptRecord*> by_number;
  for (const AttemptRecord& a : stored) by_number[a.attempt] = &a;
  Attempt prev;
  prev.layout = spec_layout;
  for (int64_t n = 1; n <= std::max<int64_t>(1, record.attempt); ++n) {
    Attempt a;
    a.number = n;
    a.layout = prev.layout;
    a.layout_attempt = n == 1 ? 1 : prev.layout_attempt;
    a.restarts = n == 1 ? 0 : prev.restarts + 1;
    if (auto it = by_number.find(n); it != by_number.end()) {
      const AttemptRecord& r = *it->second;
      a.layout = AttemptLayout{r.world_size, r.tp, r.dp, r.gradient_accumulation_steps};
      a.layout_attempt = r.layout_attempt;
      a.resume_step = r.resume_step;
      a.cause = r.cause;
    }
    history_.push_back(a);
    prev = a;
  }
  current_ = history_.back();
  current_.number = record.attempt;
  current_.restarts = record.restarts;
  current_.resume_step = record.resume_step;
  current_.resume_manifest_sha256 = record.resume_manifest_sha256;
  current_.cause = record.last_recovery_reason;
  history_.back() = current_;
}

const AttemptLayout& AttemptLog::layout(int64_t number) const {
  const size_t i = static_cast<size_t>(std::clamp<int64_t>(number, 1, current_.number) - 1);
  return history_[std::min(i, history_.size() - 1)].layout;
}

int AttemptLog::ElasticDpFor(int workers) const {
  const AttemptLayout& cur = current_.layout;
  if (!elastic()) return cur.dp;
  // The global batch in micro-batches of the layout being left: every layout keeps it.
  const int64_t global = static_cast<int64_t>(cur.gradient_accumulation_steps) * cur.dp;
  return ElasticDp(min_dp_, spec_layout_.dp, cur.tp, workers, global);
}

absl::StatusOr<AttemptLog::Attempt> AttemptLog::Next(const Recovery& r) const {
  Attempt next;
  next.number = current_.number + 1;
  next.restarts = r.resume ? 0 : current_.restarts + (r.spend_restart ? 1 : 0);
  next.resume_step = r.checkpoint_step;
  next.resume_manifest_sha256 = r.checkpoint_sha256;
  next.cause = r.cause;
  next.layout = current_.layout;
  next.layout_attempt = current_.layout_attempt;
  if (r.workers < 0 || !elastic()) return next;  // a plain recovery: the same layout
  const int dp = ElasticDpFor(r.workers);
  if (dp == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("latchkey.elastic: ", r.workers, " workers fill no layout of dp >= ", min_dp_,
                     " in whole TP groups of ", current_.layout.tp,
                     " with an integer gradient_accumulation_steps"));
  }
  const AttemptLayout& cur = current_.layout;
  next.layout.dp = dp;
  next.layout.world_size = dp * cur.tp;
  next.layout.gradient_accumulation_steps =
      static_cast<int>(static_cast<int64_t>(cur.gradient_accumulation_steps) * cur.dp / dp);
  if (next.layout != cur) next.layout_attempt = next.number;  // a new layout epoch
  return next;
}

void AttemptLog::Record(const Attempt& attempt, JobRecord* record) {
  record->attempt = attempt.number;
  record->restarts = attempt.restarts;
  record->resume_step = attempt.resume_step;
  record->resume_manifest_sha256 = attempt.resume_manifest_sha256;
  record->last_recovery_reason = attempt.cause;
}

AttemptRecord AttemptLog::ToRecord(const std::string& job_id, const Attempt& a, absl::Time start) {
  AttemptRecord r;
  r.job_id = job_id;
  r.attempt = a.number;
  r.world_size = a.layout.world_size;
  r.tp = a.layout.tp;
  r.dp = a.layout.dp;
  r.gradient_accumulation_steps = a.layout.gradient_accumulation_steps;
  r.resume_step = a.resume_step;
  r.cause = a.cause;
  r.layout_attempt = a.layout_attempt;
  r.start_time = start;
  return r;
}

void AttemptLog::Begin(Attempt next, absl::Time now) {
  current_ = std::move(next);
  history_.push_back(current_);
  recovery_start_ = now;
  violated_steps_.clear();
}

void AttemptLog::Fence(const std::string& worker_id, int64_t attempt) {
  int64_t& known = fenced_[worker_id];
  known = std::max(known, attempt);
}

int64_t AttemptLog::AttemptOf(const std::string& worker_id, int64_t call_attempt,
                              bool holds_rank) const {
  if (call_attempt != 0) return call_attempt;
  // A supervisor reporting a dead process, or a client that predates attempts.
  if (holds_rank) return current_.number;
  auto it = fenced_.find(worker_id);
  return it != fenced_.end() ? it->second : 0;
}

absl::Status AttemptLog::CheckFence(const std::string& job_id, const std::string& worker_id,
                                    int64_t call_attempt, bool holds_rank) const {
  const int64_t attempt = AttemptOf(worker_id, call_attempt, holds_rank);
  if (attempt == 0 || attempt == current_.number) return absl::OkStatus();
  // The message is for people; a worker decides on the code and the ErrorInfo's attempts.
  return AttemptFencedError(absl::StrCat("worker ", worker_id, " is at attempt ", attempt, "; job ",
                                         job_id, " is at attempt ", current_.number, " (fenced)"),
                            current_.number, attempt);
}

}  // namespace latchkey
