// The gloo backend's half of CreateProcessGroups (process_groups.cc): connects the world, TP
// and DP groups of one rank through `store`. REQUIRES: a valid grid with world_size > 1.
#ifndef LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_
#define LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_

#include "absl/status/status.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {

// Which groups to connect: one left out (another backend's) keeps what `groups` holds.
struct GlooGroupMask {
  bool world = true;
  bool tp = true;
  bool dp = true;
};

// Whether this latchkey-worker has libgloo (the core-only CUDA build may have none; then
// ConnectGlooGroups refuses by name).
bool GlooBuiltIn();

absl::Status ConnectGlooGroups(const RendezvousConfig& config, std::shared_ptr<Store> store,
                               ProcessGroups* groups, GlooGroupMask mask = {});

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_
