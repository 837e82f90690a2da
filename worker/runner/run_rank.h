// The one runner loop of a rank, whatever drives it (standalone or the coordinator). The
// process keeps one CollectiveStats, one FlightRecorder, its outputs (JSONL, metrics endpoint,
// progress) and its checkpoint saver across attempts. Per attempt (LatchSource::Begin, then
// Recover after a failure): open it (form the process groups, build the engine, load the
// attempt's checkpoint when resume_step >= 0), then for every remaining window take its latch
// from the source, run it, hand the boundary to the checkpoint manager
// (worker/checkpoint/checkpoint_manager.h: the save latchkey.checkpoint asks for, synchronous or
// staged and written in the background and committed at a later boundary, the commit's report
// to the source and pruning; the training time blocked is the JSONL's checkpoint_seconds,
// outside step_seconds), emit the outputs and tell the source; at the end save the HF
// checkpoint (when asked) and linger. A failed attempt's in-flight background write is waited
// for before the attempt ends, and never committed.
//
// Errors by meaning: every exception that escapes libtorch or a backend is caught here, once,
// and becomes a Status: a collective's own failure keeps its code (DEADLINE_EXCEEDED for a
// timeout, UNAVAILABLE for a vanished peer); anything else is a bug (INTERNAL). A failed
// attempt's engine and groups are destroyed (in that order) before LatchSource::Recover
// decides: a next attempt, or the Status the rank exits with. CANCELLED (the job ended
// elsewhere) ends the rank without Recover; so does an error of Begin (the source reports it).
#ifndef LATCHKEY_WORKER_RUNNER_RUN_RANK_H_
#define LATCHKEY_WORKER_RUNNER_RUN_RANK_H_

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "worker/comm/process_groups.h"
#include "worker/runner/latch_source.h"
#include "worker/runner/rank_outputs.h"
#include "worker/train/engine.h"

namespace latchkey {

struct RankJob {
  JobSpec spec;
  CommBackend backend = CommBackend::kAuto;
  int local_ranks = 1;  // ranks sharing this machine's cores
  // Where the engine runs (worker/runner/device.h: cpu, or cuda:LOCAL_RANK).
  comm::Device device = comm::Device::Cpu();
};

struct RunOptions {
  std::string save_dir;  // HF checkpoint after the last window; empty = none
  OutputOptions outputs;
  EngineOptions engine;
  // Test-only fault: window N throws a std::logic_error, as a bug inside the engine would.
  int64_t throw_at_window_for_testing = -1;
  // Tests only (--test-min-window-seconds, LATCHKEY_TEST_MIN_WINDOW_SECONDS;
  // docs/fault-tolerance.md): every window lasts at least this long, as a larger model's would.
  double min_window_seconds = 0;
  // Tests only (--test-perturb-replica-rank): this rank's checkpoints carry one flipped bit in a
  // replicated region, which the commit must refuse. -1: none.
  int perturb_replica_rank_for_testing = -1;
};

// Runs every window of `job` on this rank. OK when all ran (and the outputs were written).
absl::Status RunRank(const RankJob& job, LatchSource& source, const RunOptions& options);

// The Status an exception stands for (see the header comment).
absl::Status StatusFromException(const std::exception& e);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_RUN_RANK_H_
