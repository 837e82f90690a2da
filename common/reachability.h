// Which peers a rank can reach (docs/fault-tolerance.md "Partitions"): each worker listens on a
// probe port; the coordinator hands every rank its peers' addresses once all have joined; a rank
// probes them (a TCP connect with a short deadline) while it waits to form an attempt and while a
// collective of it stalls, and its heartbeats carry what it found. The coordinator tells a cut
// link from a stalled rank with it, and forms no attempt across a cut.
//
// Thread-safety: plain values.
#ifndef LATCHKEY_COMMON_REACHABILITY_H_
#define LATCHKEY_COMMON_REACHABILITY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace latchkey {

// A rank's probe address (latchkey.v1.PeerAddress).
struct PeerAddress {
  int rank = 0;
  std::string host;
  int port = 0;
};

// The peers of a rank's attempt as the coordinator hands them out: `version` changes whenever a
// rank of the job gets another worker (a new attempt, a replaced rank).
struct PeerList {
  int64_t version = 0;
  std::vector<PeerAddress> peers;  // every rank of the attempt, this one included
};

// One probe round's outcome (latchkey.v1.Reachability).
struct Reachability {
  int64_t peers_version = 0;         // the PeerList probed (0: none yet)
  int probed = 0;                    // peers probed in the round
  std::vector<int> unreachable;      // ranks whose address did not answer within the deadline
  double unreachable_seconds = 0.0;  // the longest any of them has not answered, so far
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_REACHABILITY_H_
