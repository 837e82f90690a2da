// The gloo backend's half of CreateProcessGroups (process_groups.cc): connects the world, TP
// and DP groups of one rank through `store`. REQUIRES: a valid grid with world_size > 1.
#ifndef LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_
#define LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_

#include "absl/status/status.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {

absl::Status ConnectGlooGroups(const RendezvousConfig& config, std::shared_ptr<Store> store,
                               ProcessGroups* groups);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_GLOO_GLOO_BACKEND_H_
