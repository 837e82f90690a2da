#include "worker/runner/local_gate.h"

#include <iostream>
#include <string>
#include <utility>

#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {

LocalGate::LocalGate(const JobSpec& spec, comm::RendezvousConfig rendezvous, bool resume,
                     std::string resume_from)
    : spec_(spec),
      rendezvous_(std::move(rendezvous)),
      resume_(resume),
      resume_from_(std::move(resume_from)),
      policy_(InitialPolicy(spec)) {}

absl::StatusOr<AttemptPlan> LocalGate::Begin() {
  AttemptPlan plan;
  plan.attempt = 1;
  plan.rendezvous = rendezvous_;
  plan.job_id = "standalone";
  std::string dir;
  if (!resume_from_.empty()) {
    dir = resume_from_;
  } else if (resume_) {
    const std::string& root = spec_.checkpoint.dir;
    // The newest standalone checkpoint, whichever run wrote it: this run continues its uid.
    auto newest = NewestValidCheckpoint(root, CheckpointOwner(plan.job_id));
    if (!newest.ok()) {
      return absl::Status(newest.status().code(),
                          "latchkey.checkpoint.dir: " + std::string(newest.status().message()));
    }
    if (newest->has_value()) {
      dir = (*newest)->dir;
    } else if (rendezvous_.rank == 0) {
      std::cerr << "latchkey-worker: no checkpoint in " << root << ": starting at step 0\n";
    }
  }
  next_window_ = 0;
  next_first_micro_batch_ = 0;
  next_first_sample_ = 0;
  if (!dir.empty()) {
    const std::string field = resume_from_.empty() ? "latchkey.checkpoint.dir" : "--resume-from";
    auto m = ReadCheckpointManifest(dir, "");
    if (!m.ok()) {
      return absl::Status(m.status().code(), field + ": " + std::string(m.status().message()));
    }
    const ResumePoint point = ResumePointFor(*m, spec_.dp(), spec_.micro_batch_size);
    plan.resume_step = m->step;
    plan.resume_dir = dir;
    // A standalone checkpoint's run is continued (its saves and pruning are that run's); a
    // checkpoint without a uid, or another job's (--resume-from), leaves the runner to draw one.
    if (m->job_id == plan.job_id) plan.job_uid = m->job_uid;
    next_window_ = point.next_window;
    next_first_micro_batch_ = point.next_first_micro_batch;
    next_first_sample_ = point.next_first_sample;
    if (rendezvous_.rank == 0) {
      std::cerr << "latchkey-worker: resuming from " << dir << " (written at tp " << m->tp
                << " x dp " << m->dp << ", zero_stage " << m->zero_stage << ")\n";
    }
  }
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
