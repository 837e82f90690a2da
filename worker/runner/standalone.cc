#include "worker/runner/standalone.h"

#include <cstdlib>
#include <iostream>

#include "common/latch.h"
#include "worker/comm/gloo/gloo_groups.h"
#include "worker/runner/env.h"
#include "worker/train/threads.h"

namespace latchkey {

absl::Status RunStandalone(const StandaloneOptions& options) {
  auto spec = LoadJobSpecFile(options.spec_path);
  if (!spec.ok()) return spec.status();
  for (const std::string& w : spec->warnings) std::cerr << "latchkey-worker: warning: " << w << "\n";

  auto rank = EnvInt("RANK", 0);
  auto world = EnvInt("WORLD_SIZE", 1);
  auto port = EnvInt("MASTER_PORT", 29500);
  if (!rank.ok()) return rank.status();
  if (!world.ok()) return world.status();
  if (!port.ok()) return port.status();
  auto local = EnvInt("LOCAL_WORLD_SIZE", *world);
  if (!local.ok()) return local.status();
  if (*world != spec->world_size) {
    return absl::InvalidArgumentError("latchkey.world_size: the spec asks for " +
                                      std::to_string(spec->world_size) +
                                      " ranks but WORLD_SIZE is " + std::to_string(*world));
  }
  ConfigureComputeThreads(*local);

  comm::RendezvousConfig rdv;
  const char* addr = std::getenv("MASTER_ADDR");
  rdv.host = addr && *addr ? addr : "127.0.0.1";
  rdv.port = *port;
  rdv.rank = *rank;
  rdv.world_size = *world;
  rdv.tp = spec->tp;
  rdv.collective_timeout = std::chrono::seconds(options.collective_timeout_seconds);
  auto groups = comm::CreateGlooProcessGroups(rdv);
  if (!groups.ok()) return groups.status();

  auto engine = CreateEngine(*spec, &*groups, options.engine);
  if (!engine.ok()) return engine.status();
  auto outputs = RankOutputs::Open(options.outputs, *rank, groups->stats.get());
  if (!outputs.ok()) return outputs.status();

  const LatchPolicy policy = InitialPolicy(*spec);
  int64_t first_micro_batch = 0;
  for (int64_t s = 0; s < spec->steps; ++s) {
    const Latch latch = DecideLatch(*spec, policy, s, first_micro_batch);
    auto report = (*engine)->RunWindow(latch);
    if (!report.ok()) return report.status();
    first_micro_batch += latch.n;
    // Standalone: every rank decides its latch locally, so no window waits for one.
    (*outputs)->OnStep(*spec, latch, *report, /*latch_wait_seconds=*/0.0);
  }
  if (!options.save_dir.empty()) {
    if (absl::Status st = (*engine)->SaveCheckpoint(options.save_dir); !st.ok()) {
      return absl::Status(st.code(), "--save: " + std::string(st.message()));
    }
    if (*rank == 0 && !options.outputs.quiet) std::cerr << "saved " << options.save_dir << "\n";
  }
  (*outputs)->Linger();
  return absl::OkStatus();
}

}  // namespace latchkey
