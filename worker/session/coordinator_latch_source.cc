#include "worker/session/coordinator_latch_source.h"

#include <string>

namespace latchkey {
namespace {

// How long one AwaitLatch call blocks before the loop checks the job's state again.
constexpr absl::Duration kLatchPoll = absl::Seconds(1);

std::string EndMessage(const JobEnd& end) {
  return "job " + std::string(JobStateName(end.state)) +
         (end.reason.empty() ? "" : ": " + end.reason);
}

}  // namespace

absl::StatusOr<AttemptPlan> CoordinatorLatchSource::Begin() {
  const JoinInfo& info = session_->info();
  AttemptPlan plan;
  plan.attempt = info.attempt;
  plan.job_id = session_->job_id();
  plan.rendezvous = base_;
  plan.rendezvous.host = info.rendezvous_host;
  plan.rendezvous.port = info.rendezvous_port;
  plan.rendezvous.rank = info.rank;
  plan.rendezvous.world_size = info.world_size;
  plan.rendezvous.tp = info.tp;
  plan.rendezvous.prefix = info.rendezvous_prefix.empty() ? plan.job_id : info.rendezvous_prefix;
  plan.resume_step = info.resume_step;
  plan.resume_manifest_sha256 = info.resume_manifest_sha256;
  return plan;
}

absl::StatusOr<Latch> CoordinatorLatchSource::Await(int64_t window) {
  if (!started_) {
    session_->StartLatches(window);
    started_ = true;
  }
  while (true) {
    auto latch = session_->AwaitLatch(window, kLatchPoll);
    if (latch.ok()) return latch->latch;
    // Whatever stopped the wait, a job that ended elsewhere is not this rank's failure.
    if (auto end = session_->job_end(); end.has_value()) {
      return absl::CancelledError(EndMessage(*end));
    }
    // DEADLINE_EXCEEDED: not published yet, poll again; anything else is the session's error.
    if (latch.status().code() != absl::StatusCode::kDeadlineExceeded) return latch.status();
  }
}

absl::Status CoordinatorLatchSource::StepDone(const StepReport& report) {
  return session_->ReportStep(report);
}

absl::Status CoordinatorLatchSource::Report(absl::Status error) {
  std::string msg(error.message());
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  (void)session_->ReportFailure(msg);
  return error;
}

absl::Status CoordinatorLatchSource::CheckpointCommitted(const CheckpointCommit&) {
  return absl::OkStatus();
}

absl::StatusOr<AttemptPlan> CoordinatorLatchSource::Recover(absl::Status error) {
  const bool symptom = error.code() == absl::StatusCode::kUnavailable ||
                       error.code() == absl::StatusCode::kDeadlineExceeded;
  if (!symptom) return Report(std::move(error));
  const absl::Time until = absl::Now() + session_->info().liveness_timeout * 1.5 + absl::Seconds(2);
  while (absl::Now() < until) {
    if (auto end = session_->job_end(); end.has_value()) {
      return absl::AbortedError(EndMessage(*end) + " (this rank: " + std::string(error.message()) +
                                ")");
    }
    (void)session_->Heartbeat();  // also refreshes job_end()
    absl::SleepFor(absl::Milliseconds(200));
  }
  return Report(std::move(error));
}

void CoordinatorLatchSource::Finished() { session_->Close(); }

}  // namespace latchkey
