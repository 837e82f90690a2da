// Where the next window's latch comes from, who hears how the rank's windows went, and which
// attempt the rank runs. The one runner loop (run_rank.h) asks it for an attempt (Begin), then
// for latch(first) ... latch(steps-1) in order and runs each window exactly as the latch says;
// on a failure it asks Recover for the next attempt. Two implementations:
//  - LocalGate (local_gate.h): standalone; every rank computes the latch itself with the same
//    gate function the coordinator uses (common/latch.h), so all ranks agree without talking;
//    one attempt (resuming a checkpoint with --resume), no recovery;
//  - the coordinator's latch stream (worker/session/coordinator_latch_source.h): latches as
//    published by the coordinator, prefetched; steps, checkpoints and failures are reported
//    back, and a failure of any rank turns into a new attempt for every rank.
// Thread-safety: used by the training thread only.
#ifndef LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_
#define LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/latch.h"
#include "common/step_report.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/comm/process_groups.h"

namespace latchkey {

// One attempt of the job on this rank: where its ranks meet and where it starts.
struct AttemptPlan {
  int64_t attempt = 1;
  comm::RendezvousConfig rendezvous;  // rank, world, tp, host, port, prefix of this attempt
  std::string job_id;                 // checkpoints carry it; "standalone" without a coordinator
  // The job's uid (common/job_uid.h), which its checkpoints carry too: the coordinator's, the
  // same in every attempt. Standalone: the resumed checkpoint's; empty when there is none (the
  // runner then draws one for the run, rank 0 for every rank).
  std::string job_uid;
  // The committed checkpoint (a step-N folder in latchkey.checkpoint.dir) to load first, and the
  // SHA-256 of its manifest.json it must have (empty: not checked). -1: start from scratch.
  int64_t resume_step = -1;
  std::string resume_manifest_sha256;
  // The folder of that checkpoint; empty: the step's folder of this job in
  // latchkey.checkpoint.dir (FindCheckpointDir: step-N or step-N.<job uid>).
  std::string resume_dir;
  // The attempt's gradient accumulation steps when its layout is not the spec's (an elastic
  // attempt keeps the global batch: GAS * dp / dp'); 0: the spec's. Its world size is
  // rendezvous.world_size.
  int gradient_accumulation_steps = 0;
  int64_t first_window() const { return resume_step + 1; }
};

class LatchSource {
 public:
  virtual ~LatchSource() = default;

  // The first attempt this process runs. Errors end the rank (reported by the source).
  virtual absl::StatusOr<AttemptPlan> Begin() = 0;

  // latch(window), blocking until it is known. REQUIRES: windows asked for in order from the
  // attempt's first window.
  // CANCELLED: the job ended elsewhere (cancelled, or failed by another rank): the rank stops
  // and reports nothing. ABORTED: this attempt was fenced (another rank failed): Recover.
  // Any other error is this rank's failure.
  virtual absl::StatusOr<Latch> Await(int64_t window) = 0;

  // Window report.step ran to completion on this rank.
  virtual absl::Status StepDone(const StepReport& report) = 0;

  // A checkpoint was committed after commit.step (every rank calls it; the coordinated source
  // reports it from rank 0).
  virtual absl::Status CheckpointCommitted(const CheckpointCommit& commit) = 0;

  // The current attempt failed on this rank with `error` (not OK). Returns the next attempt to
  // run when the job recovers, or the Status the rank exits with (the job failed or ended). The
  // coordinated source reports the failure, except when it is only a symptom of another rank's
  // (a peer vanished or stopped: UNAVAILABLE / DEADLINE_EXCEEDED, or the attempt was fenced),
  // and waits for the coordinator's verdict.
  virtual absl::StatusOr<AttemptPlan> Recover(absl::Status error) = 0;

  // Every window ran and the outputs are written.
  virtual void Finished() {}
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_LATCH_SOURCE_H_
