#include "worker/runner/local_gate.h"

#include <string>
#include <utility>

namespace latchkey {

LocalGate::LocalGate(const JobSpec& spec, comm::RendezvousConfig rendezvous)
    : spec_(spec), rendezvous_(std::move(rendezvous)), policy_(InitialPolicy(spec)) {}

absl::StatusOr<AttemptPlan> LocalGate::Begin() {
  AttemptPlan plan;
  plan.attempt = 1;
  plan.rendezvous = rendezvous_;
  plan.job_id = "standalone";
  next_window_ = plan.first_window();
  next_first_micro_batch_ = spec_.FirstMicroBatch(next_window_);
  return plan;
}

absl::StatusOr<Latch> LocalGate::Await(int64_t window) {
  if (window != next_window_) {
    return absl::FailedPreconditionError("local gate: window " + std::to_string(window) +
                                         " asked for out of order (next is " +
                                         std::to_string(next_window_) + ")");
  }
  Latch latch = DecideLatch(spec_, policy_, window, next_first_micro_batch_);
  next_first_micro_batch_ += latch.n;
  ++next_window_;
  return latch;
}

}  // namespace latchkey
