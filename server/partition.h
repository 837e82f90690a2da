// The partition verdict (docs/fault-tolerance.md "Partitions"): given what each rank's probes of
// its peers found (common/reachability.h), name the cut links, host by host. Pure; part of the
// Coordinator's private implementation, beside the hang verdict (hang_detector.h).
//
// A link is a pair of hosts; it is cut when some rank on one side reported a rank on the other
// unreachable. Both sides' reports of one link make one link. Ranks on one host never name each
// other (a rank that cannot reach its own host's peers is not a network fault this names).
#ifndef LATCHKEY_SERVER_PARTITION_H_
#define LATCHKEY_SERVER_PARTITION_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/reachability.h"

namespace latchkey {

struct RankReach {
  int rank = 0;
  std::string host;
  const Reachability* reach = nullptr;  // a fresh report of the current peers; null: none
  std::string where;                    // WhereName of its position ("" unknown)
};

struct CutLink {
  std::string host_a, host_b;  // host_a < host_b
  std::vector<int> ranks_a, ranks_b;
  double seconds = 0.0;  // the longest either side has found the other unreachable
};

struct PartitionVerdict {
  std::vector<CutLink> links;
  int pairs = 0;  // (rank, unreachable peer) pairs reported
  // "ranks 0,1 (10.77.0.2) cannot reach ranks 2,3 (10.77.0.3) for 9 s (reduce_scatter/dp #66)"
  // per link, joined by "; ".
  std::string message;
  // "the link between 10.77.0.2 and 10.77.0.3 (unreachable for 41 s)" per link, joined by ", ".
  std::string Links() const;
  // The longest any cut link has been unreachable, in seconds.
  double Longest() const;
};

std::optional<PartitionVerdict> FindPartition(const std::vector<RankReach>& ranks);

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_PARTITION_H_
