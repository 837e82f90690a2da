// Standalone mode: N processes started by hand (or a launcher) with torchrun-style env form the
// job's groups through a store hosted by rank 0 and train every window with the latch each rank
// computes locally from the same gate the coordinator uses.
#ifndef LATCHKEY_WORKER_RUNNER_STANDALONE_H_
#define LATCHKEY_WORKER_RUNNER_STANDALONE_H_

#include <string>

#include "absl/status/status.h"
#include "worker/runner/rank_outputs.h"
#include "worker/train/engine.h"

namespace latchkey {

struct StandaloneOptions {
  std::string spec_path;
  std::string save_dir;
  OutputOptions outputs;
  EngineOptions engine;
  int collective_timeout_seconds = 120;
};

absl::Status RunStandalone(const StandaloneOptions& options);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_STANDALONE_H_
