// The shm backend's half of CreateProcessGroups (process_groups.cc): tries to form one group
// over a shared segment, through the rendezvous store (docs/transport.md):
//   1. the group's rank 0 creates the segment in its RendezvousConfig::shm_dir, named after the
//      rendezvous prefix, the group and a random nonce, and publishes the name under
//      "<prefix>/shm/<key>/segment" (or why it could not create one);
//   2. every rank opens and maps that name in its own shm_dir, attaches, and publishes
//      "<prefix>/shm/<key>/mapped/<rank>": "1", or "0 <why>";
//   3. every rank reads every rank's answer, so all agree: the group is shm-capable when all
//      mapped it. Every rank that opened the segment unlinks its name once all have answered
//      (or on any failure), so nothing stays in the directory.
#ifndef LATCHKEY_WORKER_COMM_SHM_SHM_BACKEND_H_
#define LATCHKEY_WORKER_COMM_SHM_SHM_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {

struct ShmGroupRequest {
  std::string key;   // the group's rendezvous key: "world", "tp<dp_rank>", "dp<tp_rank>"
  std::string name;  // the group's name: "world", "tp", "dp"
  int rank = 0;      // this rank's rank in the group
  int size = 2;      // REQUIRES: > 1
  // Ranks of the job sharing this host's cores (for the spin decision).
  int host_ranks = 2;
};

// The group when every rank mapped the segment; null with *why_not set when some rank could
// not (every rank of the group returns the same); an error when the rendezvous itself failed
// (the store, a timeout).
absl::StatusOr<std::shared_ptr<Group>> TryShmGroup(const RendezvousConfig& config, Store& store,
                                                   const ShmGroupRequest& request,
                                                   std::shared_ptr<CollectiveStats> stats,
                                                   std::string* why_not);

// The segment's file name: "latchkey-shm-<prefix, sanitised>-<key>-<nonce in hex>".
std::string ShmSegmentName(const std::string& prefix, const std::string& key, uint64_t nonce);

// The CPUs this process may run on (its affinity mask; hardware_concurrency as a fallback).
int UsableCpus();

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_SHM_SHM_BACKEND_H_
