// LatchSource over the coordinator's latch stream (WorkerSession): latch(s) as the coordinator
// published it (prefetched by the session's stream, so a window waits only when the
// coordinator is behind), every step reported back, and this rank's failures reported so the
// coordinator fails the job with the reason.
//
// Failures by meaning: a collective that timed out or lost its peer (DEADLINE_EXCEEDED,
// UNAVAILABLE) is usually a symptom of another rank's death, which the coordinator's liveness
// check names; for those the source waits for the coordinator's verdict (up to the liveness
// timeout, plus slack) before reporting its own error. Every other error (a bad file, a bug:
// INTERNAL) is reported at once.
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
  // CANCELLED once the coordinator says the job ended (cancelled, or failed elsewhere).
  absl::StatusOr<Latch> Await(int64_t window) override;
  absl::Status StepDone(const StepReport& report) override;
  absl::Status CheckpointCommitted(const CheckpointCommit& commit) override;
  absl::StatusOr<AttemptPlan> Recover(absl::Status error) override;
  void Finished() override;

 private:
  // Reports `error` (its first line) to the coordinator, best effort, and returns it.
  absl::Status Report(absl::Status error);

  WorkerSession* session_;
  comm::RendezvousConfig base_;
  bool started_ = false;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_COORDINATOR_LATCH_SOURCE_H_
