// The address exchange of a full mesh (every rank of a group connects to every other), through
// the rendezvous store in O(1) store requests per rank.
//
// A full mesh of N ranks has N x (N - 1) pair endpoints. The naive exchange (every rank
// publishes the addresses of its N - 1 endpoints, every rank reads every peer's list: gloo's
// connectFullMesh) makes N^2 store requests and moves N^3 bytes through the store's one host:
// at 1,024 ranks that is a million requests and minutes. Here:
//   1. every rank publishes one compact record: its host (one address shared by all its
//      endpoints, opaque bytes to this exchange) and the port of its endpoint for each peer
//      (2 bytes a peer);
//   2. the group's rank 0 waits for the N records, reads them, and publishes the distinct hosts
//      (one value) and, for each rank i, the port and host of every peer's endpoint for i
//      (6 bytes a peer: the transpose of the records);
//   3. every other rank reads its own value and the hosts: 2 requests.
// Store requests: rank 0 makes 2N (1 wait, N - 1 gets, N sets), every other rank 3 (1 set,
// 2 gets), whatever N. Bytes through the store:
// 8 N^2 in all (every record and every transposed value), against ~136 N^3 before.
// Keys, under the store given (a group's prefix): "mesh/rec/<rank>", "mesh/hosts",
// "mesh/to/<rank>".
#ifndef LATCHKEY_WORKER_COMM_MESH_EXCHANGE_H_
#define LATCHKEY_WORKER_COMM_MESH_EXCHANGE_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/store.h"

namespace latchkey::comm {

// What this rank learns: for each peer j (its own entry is unused), the host of j's endpoint
// for this rank (an index into `hosts`) and that endpoint's port.
struct MeshPeers {
  std::vector<std::vector<uint8_t>> hosts;  // distinct host records, as their ranks published
  std::vector<uint32_t> host;               // [size]: index into hosts
  std::vector<uint16_t> port;               // [size]
};

// `ports[j]` is the port of this rank's endpoint for peer j (ports.size() == size; the entry
// for `rank` itself is ignored). `host` is at most 1 KiB. Blocks until the group's rank 0 has
// published this rank's value, at most `timeout` per wait.
// DEADLINE_EXCEEDED (a rank that never published, named), UNAVAILABLE (the store),
// INVALID_ARGUMENT (bad arguments), DATA_LOSS (a record or value of the wrong length, named).
absl::StatusOr<MeshPeers> ExchangeMeshAddresses(Store& store, int rank, int size,
                                                const std::vector<uint8_t>& host,
                                                const std::vector<uint16_t>& ports,
                                                std::chrono::milliseconds timeout);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_MESH_EXCHANGE_H_
