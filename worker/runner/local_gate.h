// LatchSource for standalone ranks: latch(s) from the gate (common/latch.h) over the spec's
// initial policy, computed locally and identically on every rank; nothing is reported. One
// attempt; with `resume` it starts after the newest valid checkpoint of latchkey.checkpoint.dir
// (job id "standalone"), or at step 0 when there is none.
#ifndef LATCHKEY_WORKER_RUNNER_LOCAL_GATE_H_
#define LATCHKEY_WORKER_RUNNER_LOCAL_GATE_H_

#include "common/job_spec.h"
#include "worker/runner/latch_source.h"

namespace latchkey {

class LocalGate final : public LatchSource {
 public:
  // `spec` must outlive the gate. `rendezvous`: where the ranks meet (torchrun-style env).
  // `resume` REQUIRES spec.checkpoint.enabled().
  LocalGate(const JobSpec& spec, comm::RendezvousConfig rendezvous, bool resume = false);

  absl::StatusOr<AttemptPlan> Begin() override;
  absl::StatusOr<Latch> Await(int64_t window) override;
  absl::Status StepDone(const StepReport&) override { return absl::OkStatus(); }
  absl::Status CheckpointCommitted(const CheckpointCommit&) override { return absl::OkStatus(); }
  // Standalone ranks do not recover: the error ends the rank.
  absl::StatusOr<AttemptPlan> Recover(absl::Status error) override { return error; }

 private:
  const JobSpec& spec_;
  comm::RendezvousConfig rendezvous_;
  bool resume_ = false;
  LatchPolicy policy_;
  int64_t next_window_ = 0;
  int64_t next_first_micro_batch_ = 0;  // M of next_window_
  int64_t next_first_sample_ = 0;       // first_sample of next_window_
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_LOCAL_GATE_H_
