#include "worker/runner/local_gate.h"

#include <string>

namespace latchkey {

LocalGate::LocalGate(const JobSpec& spec) : spec_(spec), policy_(InitialPolicy(spec)) {}

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
