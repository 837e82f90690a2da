// Standalone mode: N processes started by hand (or a launcher) with torchrun-style env form the
// job's groups through a store hosted by rank 0 and train every window with the latch each rank
// computes locally (LocalGate) from the same gate the coordinator uses. One attempt: a failure
// ends the rank; rerunning every rank with --resume continues from the last checkpoint.
//
// The caller loads the spec (LoadJobSpecFile) once, has CheckStandaloneOptions judge the options
// against it (a refusal is a usage error of the flags), then runs it with RunStandalone.
#ifndef LATCHKEY_WORKER_RUNNER_STANDALONE_H_
#define LATCHKEY_WORKER_RUNNER_STANDALONE_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/timeouts.h"
#include "worker/runner/env.h"
#include "worker/runner/run_rank.h"

namespace latchkey {

struct StandaloneOptions {
  std::string spec_path;
  RunOptions run;
  std::chrono::milliseconds collective_timeout{kDefaultCollectiveTimeout};
  // --resume: continue after the newest valid checkpoint in latchkey.checkpoint.dir (step 0
  // when there is none). The spec must have latchkey.checkpoint.
  bool resume = false;
  // --resume-from: continue after the checkpoint in this step-N folder, whatever layout or
  // checkpoint root wrote it.
  std::string resume_from;
};

// The one check of the options against the spec they run: --resume needs latchkey.checkpoint
// (INVALID_ARGUMENT naming the spec file otherwise); --resume-from needs a folder with a
// manifest.json (INVALID_ARGUMENT naming --resume-from otherwise).
absl::Status CheckStandaloneOptions(const StandaloneOptions& options, const JobSpec& spec);

// Runs this rank of `spec` (loaded from options.spec_path and passed CheckStandaloneOptions):
// prints the spec's warnings, checks WORLD_SIZE against latchkey.world_size (INVALID_ARGUMENT),
// places the rank and trains every window.
absl::Status RunStandalone(const StandaloneOptions& options, JobSpec spec, const WorkerEnv& env);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_STANDALONE_H_
