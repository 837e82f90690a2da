// Where the next window's latch comes from, and who hears how the rank's windows went. The one
// runner loop (run_rank.h) asks it for latch(0), latch(1), ... in order and runs each window
// exactly as the latch says; two implementations:
//  - LocalGate (local_gate.h): standalone; every rank computes the latch itself with the same
//    gate function the coordinator uses (common/latch.h), so all ranks agree without talking;
//  - the coordinator's latch stream (worker/session/coordinator_latch_source.h): latches as
//    published by the coordinator, prefetched; steps and failures are reported back.
// Thread-safety: used by the training thread only.
#ifndef LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_
#define LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/latch.h"
#include "common/step_report.h"

namespace latchkey {

class LatchSource {
 public:
  virtual ~LatchSource() = default;

  // latch(window), blocking until it is known. REQUIRES: windows asked for in order from 0.
  // CANCELLED: the job ended elsewhere (cancelled, or failed by another rank): the rank stops
  // and reports nothing. Any other error is this rank's failure.
  virtual absl::StatusOr<Latch> Await(int64_t window) = 0;

  // Window report.step ran to completion on this rank.
  virtual absl::Status StepDone(const StepReport& report) = 0;

  // This rank failed with `error` (not OK). Returns the Status the rank exits with; a
  // coordinated source reports the failure, first waiting briefly for the coordinator's
  // verdict when the error is only a symptom of another rank's failure (a peer vanished or
  // stopped: UNAVAILABLE / DEADLINE_EXCEEDED), so the job fails naming the cause.
  virtual absl::Status Failed(absl::Status error) = 0;

  // Every window ran and the outputs are written.
  virtual void Finished() {}
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_
