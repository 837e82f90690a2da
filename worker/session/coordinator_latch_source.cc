#include "worker/session/coordinator_latch_source.h"

#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/error_info.h"
#include "worker/comm/flight_recorder.h"

namespace latchkey {
namespace {

// How long one AwaitLatch call blocks before the loop checks the job's state again.
constexpr absl::Duration kLatchPoll = absl::Seconds(1);
// How often Recover asks the coordinator whether the job moved on.
constexpr absl::Duration kRecoverPoll = absl::Milliseconds(200);

std::string EndMessage(const JobEnd& end) {
  return "job " + std::string(JobStateName(end.state)) +
         (end.reason.empty() ? "" : ": " + end.reason);
}

// The session was closed under the rank (common/error_info.h SESSION_CLOSED): not a fault of
// the job's configuration.
bool IsSessionClosed(const absl::Status& error) {
  return HasErrorReason(error, error_reason::kSessionClosed);
}

// The training diverged (common/error_info.h TRAINING_DIVERGED): the job's end, not a fault.
bool IsDiverged(const absl::Status& error) {
  return HasErrorReason(error, error_reason::kTrainingDiverged);
}

// A peer vanished or stopped, or the attempt was fenced, or the session was closed under the
// rank: another rank's failure (or the rank's own shutdown) shows here.
bool IsSymptom(const absl::Status& error) {
  return error.code() == absl::StatusCode::kUnavailable ||
         error.code() == absl::StatusCode::kDeadlineExceeded ||
         error.code() == absl::StatusCode::kAborted || IsSessionClosed(error);
}

}  // namespace

absl::StatusOr<AttemptPlan> CoordinatorLatchSource::Begin() {
  // The ranks meet once the coordinator formed the attempt: every rank has joined (an elastic
  // recovery that cannot get its ranks back moves to a smaller layout instead, and a rank
  // waiting in the rendezvous of the abandoned one could not leave it), and, across hosts,
  // every rank reached every other (no rendezvous across a cut link: docs/fault-tolerance.md
  // "Partitions"). Joining again is idempotent (the same rank, the job's state now) and adopts
  // a newer attempt when there is one.
  while (!session_->info().spare && (session_->info().state == JobState::kPending ||
                                     session_->info().state == JobState::kRecovering ||
                                     session_->info().state == JobState::kPreempted)) {
    absl::SleepFor(kRecoverPoll);
    if (absl::Status st = session_->Rejoin(); !st.ok()) {
      // Suspended meanwhile: nothing failed; the process leaves for its supervisor to stop.
      if (HasErrorReason(st, error_reason::kJobSuspended)) return st;
      return Report(st);
    }
  }
  const JoinInfo& info = session_->info();
  if (info.spare) return NotNeeded(info);
  AttemptPlan plan;
  plan.attempt = info.attempt;
  plan.job_id = session_->job_id();
  plan.job_uid = info.job_uid;
  plan.rendezvous = base_;
  plan.rendezvous.host = info.rendezvous_host;
  plan.rendezvous.port = info.rendezvous_port;
  plan.rendezvous.rank = info.rank;
  plan.rendezvous.world_size = info.world_size;
  plan.rendezvous.tp = info.tp;
  plan.rendezvous.prefix = info.rendezvous_prefix.empty() ? plan.job_id : info.rendezvous_prefix;
  plan.resume_step = info.resume_step;
  plan.resume_manifest_sha256 = info.resume_manifest_sha256;
  plan.gradient_accumulation_steps = info.gradient_accumulation_steps;
  if (base_.recorder) {
    base_.recorder->SetAttempt(info.attempt);
    base_.recorder->SetPhase(RankPhase::kIdle);
  }
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
    // DEADLINE_EXCEEDED: not published yet, poll again; anything else is the session's error
    // (ABORTED when the attempt was fenced).
    if (latch.status().code() != absl::StatusCode::kDeadlineExceeded) return latch.status();
  }
}

absl::Status CoordinatorLatchSource::StepDone(const StepReport& report) {
  return session_->ReportStep(report);
}

namespace {

// Errors that say the job itself is wrong for this machine or this spec (a missing CUDA device,
// a refused field, a checkpoint of another layout): every restart would meet them again.
bool IsConfigurationError(const absl::Status& error) {
  if (IsSessionClosed(error)) return false;
  switch (error.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status CoordinatorLatchSource::Report(absl::Status error) {
  std::string msg(error.message());
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  const std::optional<ErrorInfo> info = GetErrorInfo(error);
  const std::string reason = info && info->domain == kErrorDomain ? info->reason : "";
  // A diverged training is also sent as permanent: a coordinator that does not know the reason
  // fails the job at once too.
  (void)session_->ReportFailure(msg, IsConfigurationError(error) || IsDiverged(error), reason);
  return error;
}

absl::Status CoordinatorLatchSource::Abandon(absl::Status error) {
  return Report(std::move(error));
}

absl::Status CoordinatorLatchSource::CheckpointCommitted(const CheckpointCommit& commit) {
  if (session_->info().rank != 0) return absl::OkStatus();
  return session_->ReportCheckpoint(commit.step, commit.manifest_sha256, commit.bytes,
                                    commit.blocked_seconds);
}

absl::StatusOr<AttemptPlan> CoordinatorLatchSource::Recover(absl::Status error) {
  session_->BeginRecovery();  // the watchdog sees the training thread came back
  if (base_.recorder) base_.recorder->SetPhase(RankPhase::kIdle);
  const bool symptom = IsSymptom(error);
  // The job's end, named with this rank's error: an own error is what the job failed with.
  auto ended = [&](const JobEnd& end) -> absl::Status {
    if (!symptom) return error;
    return absl::AbortedError(EndMessage(end) + " (this rank: " + std::string(error.message()) +
                              ")");
  };
  if (auto end = session_->job_end(); end.has_value()) return ended(*end);
  // A process told to stop (SIGTERM, SIGINT) leaves after its attempt's save (or whatever ended
  // the attempt first): its replacement joins the next attempt, not it.
  if (session_->stop_signalled()) {
    std::cerr << "latchkey-worker: rank " << session_->info().rank << ": leaving ("
              << error.message() << ")" << std::endl;
    if (HasErrorReason(error, error_reason::kAttemptStopped)) return error;
    // Leaves as preempted, whatever ended its attempt first.
    ErrorInfo info;
    info.reason = error_reason::kAttemptStopped;
    return WithErrorInfo(
        absl::AbortedError(absl::StrCat("left on a stop signal (", error.message(), ")")), info);
  }
  // The verdict on a diverged training is known: the job fails with it, no new attempt comes.
  if (IsDiverged(error)) return Report(std::move(error));
  if (!symptom) (void)Report(error);
  // The rank's log says what happened to it: `latchkey logs` shows every recovery.
  std::cerr << "latchkey-worker: rank " << session_->info().rank << ": attempt "
            << session_->attempt() << " stopped: " << error.message()
            << "; waiting for the coordinator's verdict" << std::endl;

  // Wait for the coordinator's verdict: a newer attempt, or the job's end. A symptom may take
  // the liveness deadline (a dead peer) or the hang timeout (a stopped one) to be named.
  const int64_t mine = session_->attempt();
  const JoinInfo& info = session_->info();
  const absl::Time until =
      absl::Now() + info.liveness_timeout * 1.5 + info.hang_timeout + absl::Seconds(2);
  while (session_->job_attempt() <= mine) {
    if (auto end = session_->job_end(); end.has_value()) return ended(*end);
    if (absl::Now() >= until) {
      // Nobody named a cause: this rank's error is the one the job hears of.
      return symptom ? Report(std::move(error)) : error;
    }
    (void)session_->Heartbeat();  // refreshes job_end(), job_attempt() and job_state()
    if (session_->job_attempt() > mine) break;
    if (session_->job_state() == JobState::kSuspended) {
      // The stop this rank saved for was a suspend: it waits for `latchkey resume`, without
      // this process.
      ErrorInfo info;
      info.reason = error_reason::kJobSuspended;
      return WithErrorInfo(absl::FailedPreconditionError(
                               absl::StrCat("job ", session_->job_id(), " is suspended; leaving")),
                           info);
    }
    absl::SleepFor(kRecoverPoll);
  }
  if (absl::Status st = session_->Rejoin(); !st.ok()) {
    if (auto end = session_->job_end(); end.has_value()) return ended(*end);
    return absl::Status(st.code(), absl::StrCat("rejoin ", session_->job_id(), " for attempt ",
                                                session_->job_attempt(), ": ", st.message(),
                                                " (this rank: ", error.message(), ")"));
  }
  started_ = false;  // the new attempt's stream starts at its first window
  std::cerr << "latchkey-worker: rank " << session_->info().rank << ": joined attempt "
            << session_->attempt() << " (recovery)" << std::endl;
  return Begin();
}

absl::Status CoordinatorLatchSource::NotNeeded(const JoinInfo& info) {
  // A spare whose wait ended with the job (the session joins again while the job runs).
  return absl::CancelledError(absl::StrCat(
      "not needed: job ", session_->job_id(), " ", JobStateName(info.state),
      info.failure_reason.empty() ? "" : ": ", info.failure_reason, " without this worker"));
}

void CoordinatorLatchSource::Finished() { session_->Close(); }

}  // namespace latchkey
