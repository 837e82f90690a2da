#include "worker/runner/standalone.h"

#include <iostream>

#include "worker/checkpoint/files.h"
#include "worker/runner/device.h"
#include "worker/runner/local_gate.h"

namespace latchkey {

absl::Status CheckStandaloneOptions(const StandaloneOptions& options, const JobSpec& spec) {
  if (options.resume && !spec.checkpoint.enabled()) {
    return absl::InvalidArgumentError(
        "--resume needs latchkey.checkpoint (latchkey.checkpoint.dir) in " + options.spec_path);
  }
  // A folder that is not a committed checkpoint is a usage error; a damaged one is the run's
  // (DATA_LOSS when the gate or the load reads it).
  if (!options.resume_from.empty() &&
      !IsRegularFile(JoinPath(options.resume_from, "manifest.json"))) {
    return absl::InvalidArgumentError("--resume-from " + options.resume_from +
                                      ": no manifest.json (not a committed checkpoint folder)");
  }
  return absl::OkStatus();
}

absl::Status RunStandalone(const StandaloneOptions& options, JobSpec spec, const WorkerEnv& env) {
  for (const std::string& w : spec.warnings) std::cerr << "latchkey-worker: warning: " << w << "\n";

  RankJob job;
  job.spec = std::move(spec);
  const int world = env.world_size.value_or(1);
  if (world != job.spec.world_size) {
    return absl::InvalidArgumentError("latchkey.world_size: the spec asks for " +
                                      std::to_string(job.spec.world_size) +
                                      " ranks but WORLD_SIZE is " + std::to_string(world));
  }
  job.local_ranks = env.local_world_size.value_or(world);
  auto placed = PlaceRank(job.spec, env, env.rank.value_or(0), job.local_ranks);
  if (!placed.ok()) return placed.status();
  job.device = placed->device;
  job.backend = placed->backend;
  comm::RendezvousConfig rdv;
  rdv.host = env.master_addr;
  rdv.port = env.master_port;
  rdv.rank = env.rank.value_or(0);
  rdv.world_size = world;
  rdv.tp = job.spec.tp;
  rdv.local_address = env.transport_host;
  rdv.collective_timeout = options.collective_timeout;
  LocalGate gate(job.spec, rdv, options.resume, options.resume_from);
  return RunRank(job, gate, options.run);
}

}  // namespace latchkey
