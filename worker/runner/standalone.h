// Standalone mode: N processes started by hand (or a launcher) with torchrun-style env form the
// job's groups through a store hosted by rank 0 and train every window with the latch each rank
// computes locally from the same gate the coordinator uses.
#ifndef LATCHKEY_WORKER_RUNNER_STANDALONE_H_
#define LATCHKEY_WORKER_RUNNER_STANDALONE_H_

#include <string>

#include "absl/status/status.h"
#include "worker/train/engine.h"

namespace latchkey {

struct StandaloneOptions {
  std::string spec_path;
  std::string metrics_jsonl;  // "{rank}" replaced by the rank
  std::string save_dir;
  bool quiet = false;
  // Prometheus endpoint (builds with metrics only): port -1 = off, 0 = pick a free one.
  std::string metrics_host = "0.0.0.0";
  int metrics_port = -1;
  double linger_seconds = 0;  // keep serving metrics this long after the last step
  EngineOptions engine;
};

absl::Status RunStandalone(const StandaloneOptions& options);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_STANDALONE_H_
