// The nccl backend's half of CreateProcessGroups (process_groups.cc): connects the world, TP
// and DP groups of one rank as NCCL communicators on the config's device (cuda:LOCAL_RANK from
// the runner), which it makes this thread's current device. REQUIRES: a valid grid with
// world_size > 1 and a cuda device in the config.
//
// Rendezvous, per group in the order world, TP, DP: rank 0 of the group creates the NCCL unique
// id (ncclGetUniqueId, which needs no GPU) and publishes its 128 bytes through the rendezvous
// store under the group's key prefix (standalone: the TCP store rank 0 hosts; under a
// coordinator: the attempt's rendezvous, JOB/aN, that the coordinator hands out); every rank
// reads it and publishes the SHA-256 of what it got; rank 0 checks every digest against its own
// and publishes its verdict, which the others read (store operations linear in the ranks);
// rank 0, which hosts the TCP store, waits until every rank has its ids. Only then is the CUDA
// device checked (FAILED_PRECONDITION naming it and the CUDA runtime's error, the ids' digests
// included) and the communicators initialized (nonblocking, within the rendezvous timeout,
// aborted past it).
// Without LATCHKEY_CUDA, ConnectNcclGroups is UNIMPLEMENTED naming the build option.
#ifndef LATCHKEY_WORKER_COMM_NCCL_NCCL_BACKEND_H_
#define LATCHKEY_WORKER_COMM_NCCL_NCCL_BACKEND_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {

absl::Status ConnectNcclGroups(const RendezvousConfig& config, std::shared_ptr<Store> store,
                               ProcessGroups* groups);

// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// One group's id exchange through `store` (already namespaced for the group): rank 0 creates
// and publishes the id, every rank returns the bytes it got once rank 0 has checked every rank's
// SHA-256 against its own (on every rank INTERNAL naming the rank that differs). DEADLINE_EXCEEDED
// / UNAVAILABLE from the store. REQUIRES: 0 <= rank < size.
absl::StatusOr<std::string> ExchangeNcclUniqueId(Store& store, int rank, int size,
                                                 std::chrono::milliseconds timeout);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_NCCL_NCCL_BACKEND_H_
