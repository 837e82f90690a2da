// Named defaults for every blocking call, in one place. Flags and spec keys override them;
// nothing else spells these numbers.
#ifndef LATCHKEY_COMMON_TIMEOUTS_H_
#define LATCHKEY_COMMON_TIMEOUTS_H_

#include <chrono>

namespace latchkey {

// No collective blocks longer than this (latchkey-worker --collective-timeout-seconds).
inline constexpr std::chrono::seconds kDefaultCollectiveTimeout{120};
// Forming the process groups: every rank must reach the rendezvous store within this.
inline constexpr std::chrono::seconds kDefaultRendezvousTimeout{120};
// One unary RPC attempt to the coordinator.
inline constexpr std::chrono::seconds kDefaultRpcTimeout{10};
// A worker that joined gives up on an unreachable coordinator after this: as long as a job waits
// out a cut link (latchkey.partition_timeout_seconds' default), so a worker rides through its
// coordinator's network being cut as the job rides through its own.
inline constexpr std::chrono::seconds kDefaultReconnectTimeout{600};
// A worker's first Join waits this long for a coordinator that does not answer.
inline constexpr std::chrono::seconds kDefaultJoinTimeout{120};

// A worker unseen for this long fails its job (latchkey-coordinator --liveness-timeout).
inline constexpr std::chrono::seconds kDefaultLivenessTimeout{30};
// How often workers heartbeat: each beat carries the rank's position, so the hang detector
// (two missed beats make a rank silent) sees a stall within seconds.
inline constexpr std::chrono::seconds kDefaultHeartbeatInterval{1};

// Where clients look for the coordinator when neither a flag nor $LATCHKEY_COORDINATOR says,
// and the port the coordinator listens on by default (the same one).
inline constexpr char kDefaultCoordinatorAddress[] = "localhost:50051";
inline constexpr int kDefaultCoordinatorPort = 50051;

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_TIMEOUTS_H_
