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

AttemptLog::AttemptLog(const JobRecord& record, const AttemptLayout& layout) {
  current_.number = record.attempt;
  current_.restarts = record.restarts;
  current_.resume_step = record.resume_step;
  current_.resume_manifest_sha256 = record.resume_manifest_sha256;
  current_.cause = record.last_recovery_reason;
  current_.layout = layout;
  layouts_.emplace(1, layout);
}

const AttemptLayout& AttemptLog::layout(int64_t number) const {
  auto it = layouts_.upper_bound(number);
  if (it != layouts_.begin()) --it;
  return it->second;
}

AttemptLog::Attempt AttemptLog::Next(const std::string& cause, int64_t checkpoint_step,
                                     const std::string& checkpoint_sha256) const {
  Attempt next;
  next.number = current_.number + 1;
  next.restarts = current_.restarts + 1;
  next.resume_step = checkpoint_step;
  next.resume_manifest_sha256 = checkpoint_sha256;
  next.cause = cause;
  // Every attempt runs the layout of the one before: the spec's. Elastic recovery decides here.
  next.layout = current_.layout;
  return next;
}

void AttemptLog::Record(const Attempt& attempt, JobRecord* record) {
  record->attempt = attempt.number;
  record->restarts = attempt.restarts;
  record->resume_step = attempt.resume_step;
  record->resume_manifest_sha256 = attempt.resume_manifest_sha256;
  record->last_recovery_reason = attempt.cause;
}

void AttemptLog::Begin(Attempt next, absl::Time now) {
  if (next.layout != layout()) layouts_[next.number] = next.layout;
  current_ = std::move(next);
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
