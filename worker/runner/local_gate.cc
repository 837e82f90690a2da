#include "worker/runner/local_gate.h"

#include <iostream>
#include <string>
#include <utility>

#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {

LocalGate::LocalGate(const JobSpec& spec, comm::RendezvousConfig rendezvous, bool resume)
    : spec_(spec),
      rendezvous_(std::move(rendezvous)),
      resume_(resume),
      policy_(InitialPolicy(spec)) {}

absl::StatusOr<AttemptPlan> LocalGate::Begin() {
  AttemptPlan plan;
  plan.attempt = 1;
  plan.rendezvous = rendezvous_;
  plan.job_id = "standalone";
  if (resume_) {
    const std::string& dir = spec_.checkpoint.dir;
    auto newest = NewestValidCheckpoint(dir, plan.job_id);
    if (!newest.ok()) {
      return absl::Status(newest.status().code(),
                          "latchkey.checkpoint.dir: " + std::string(newest.status().message()));
    }
    if (newest->has_value()) plan.resume_step = **newest;
    if (rendezvous_.rank == 0) {
      if (plan.resume_step >= 0) {
        std::cerr << "latchkey-worker: resuming from " << dir << "/"
                  << CheckpointStepDirName(plan.resume_step) << "\n";
      } else {
        std::cerr << "latchkey-worker: no checkpoint in " << dir << ": starting at step 0\n";
      }
    }
  }
  next_window_ = plan.first_window();
  next_first_micro_batch_ = spec_.FirstMicroBatch(next_window_);
  next_first_sample_ = next_first_micro_batch_ * SamplesPerMicroBatch(spec_);
  return plan;
}

absl::StatusOr<Latch> LocalGate::Await(int64_t window) {
  if (window != next_window_) {
    return absl::FailedPreconditionError("local gate: window " + std::to_string(window) +
                                         " asked for out of order (next is " +
                                         std::to_string(next_window_) + ")");
  }
  Latch latch = DecideLatch(spec_, policy_, window, next_first_micro_batch_, next_first_sample_);
  next_first_micro_batch_ += latch.n;
  next_first_sample_ += latch.n * SamplesPerMicroBatch(spec_);
  ++next_window_;
  return latch;
}

}  // namespace latchkey
