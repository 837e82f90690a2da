// LatchSource over the coordinator's latch stream (WorkerSession): latch(s) as the coordinator
// published it (prefetched by the session's stream, so a window waits only when the
// coordinator is behind), every step and rank 0's checkpoints reported back, and this rank's
// failures reported so the coordinator recovers the job (a new attempt) or fails it with the
// reason.
//
// Failures by meaning: a collective that timed out or lost its peer (DEADLINE_EXCEEDED,
// UNAVAILABLE), or a fenced attempt (ABORTED), is a symptom of another rank's failure, which
// the coordinator names (liveness, hang detection, the rank's own report); every other error
// (a bad file, a bug: INTERNAL) is reported at once. Either way Recover then waits for the
// coordinator's verdict (up to liveness timeout * 1.5 + hang timeout + slack): a newer attempt
// (the session joins it and Recover returns its plan) or the job's end (the rank exits: with
// its own error, or ABORTED naming the job's end and the symptom). A symptom nobody named in
// that time is reported as this rank's failure. A diverged training (TRAINING_DIVERGED,
// common/error_info.h) is reported with its reason and returned at once: the job fails with it.
// `base.recorder`, when set, hears each attempt's number (SetAttempt) at Begin.
// Elastic jobs (JoinInfo::elastic): Begin waits (joining again) until every rank of the
// attempt has joined before it hands out the plan, and a worker the coordinator made a spare
// (WorkerSession joins again until it has a rank) that the job ended without gets CANCELLED
// ("not needed: ...") from Begin or Recover.
// Thread-safety: the training thread only. `session` outlives the source.
#ifndef LATCHKEY_WORKER_SESSION_COORDINATOR_LATCH_SOURCE_H_
#define LATCHKEY_WORKER_SESSION_COORDINATOR_LATCH_SOURCE_H_

#include <utility>

#include "absl/time/time.h"
#include "worker/runner/latch_source.h"
#include "worker/session/worker_session.h"

namespace latchkey {

class CoordinatorLatchSource final : public LatchSource {
 public:
  // `base`: this rank's transport settings (local address, timeouts); the coordinator's join
  // answer fills in where and as which rank it meets the others.
  CoordinatorLatchSource(WorkerSession* session, comm::RendezvousConfig base)
      : session_(session), base_(std::move(base)) {}

  absl::StatusOr<AttemptPlan> Begin() override;
  // CANCELLED once the coordinator says the job ended (cancelled, or failed elsewhere);
  // ABORTED once the attempt was fenced.
  absl::StatusOr<Latch> Await(int64_t window) override;
  absl::Status StepDone(const StepReport& report) override;
  absl::Status CheckpointCommitted(const CheckpointCommit& commit) override;
  absl::StatusOr<AttemptPlan> Recover(absl::Status error) override;
  void Finished() override;
  // A failure before any attempt could start (e.g. the spec does not parse): reported, and
  // returned for the rank to exit with; no recovery is awaited.
  absl::Status Abandon(absl::Status error);

 private:
  // Reports `error` (its first line) to the coordinator, best effort, and returns it.
  absl::Status Report(absl::Status error);
  // CANCELLED naming the job's end: a spare (latchkey.elastic) the job ended without.
  absl::Status NotNeeded(const JoinInfo& info);

  WorkerSession* session_;
  comm::RendezvousConfig base_;
  bool started_ = false;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_COORDINATOR_LATCH_SOURCE_H_
