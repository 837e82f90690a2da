// The hang verdict (docs/fault-tolerance.md "Hang and straggler detection"): given where every
// rank of a running job is, as its heartbeats said, decide whether the job is stalled and name
// the culprit. Pure; part of the Coordinator's private implementation.
//
// A rank's time at its position is the position's `seconds` plus the time since its heartbeat
// arrived. A rank whose last heartbeat is older than `silent_after` is silent (stalled at its
// last position). The job is stalled when some rank has been at its position longer than
// `hang_timeout` (a rank in the idle phase only when it is silent: it is not in the plan yet).
// The culprit is a silent rank (the one silent longest), else the rank furthest behind in the
// plan: the smallest (window, seq), where at the same seq a rank in latch or compute is behind
// one inside collective #seq, which is behind one in eval or checkpoint. Ties: the lower rank.
//
// A slow collective is not a stalled one: while some rank inside a collective reports that its
// connections to its peers moved bytes within the hang timeout (RankPosition::quiet_seconds),
// the job is not stalled.
#ifndef LATCHKEY_SERVER_HANG_DETECTOR_H_
#define LATCHKEY_SERVER_HANG_DETECTOR_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/rank_position.h"

namespace latchkey {

struct RankWatch {
  int rank = 0;
  RankPosition position;
  absl::Duration since_heartbeat;  // now - arrival of the heartbeat that carried `position`
};

struct StallVerdict {
  StalledRank stalled;  // attempt left 0: the caller knows it
  // "rank 1 stalled in window 12, micro-batch 3 (compute) for 14 s; ranks 0,2,3 waiting in
  // all_reduce/tp #57" (a silent culprit adds ", no heartbeat for N s" before the ';').
  std::string message;
};

std::optional<StallVerdict> FindStall(const std::vector<RankWatch>& ranks,
                                      absl::Duration hang_timeout, absl::Duration silent_after);

// "in window 12, micro-batch 3 (compute)", "before the first window (idle)": where a rank is.
std::string DescribePosition(const RankPosition& p);

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_HANG_DETECTOR_H_
