// Where a rank is right now, as its heartbeats carry it: the live flight recorder of a job.
// The worker's comm layer and engine keep it current (worker/comm/flight_recorder.h); the
// coordinator compares the positions of all ranks against the plan (every rank issues the same
// collectives in the same order) to name a stalled rank (docs/fault-tolerance.md).
//
// Durations, not timestamps: `seconds` is how long the rank has been at this position when the
// heartbeat left, so clocks of different hosts never need to agree.
#ifndef LATCHKEY_COMMON_RANK_POSITION_H_
#define LATCHKEY_COMMON_RANK_POSITION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace latchkey {

// What the rank is doing at its position.
enum class RankPhase {
  kIdle,        // before the first window, or between attempts
  kLatch,       // waiting for latch(window)
  kCompute,     // forward/backward/optimizer arithmetic (no collective pending)
  kCollective,  // inside collective #seq of the window (op, group)
  kCheckpoint,  // writing or committing a checkpoint after `window`
  kEval,        // the evaluation after `window`
};

struct RankPosition {
  int64_t attempt = 0;  // the job attempt this rank runs (0: not yet known)
  int64_t window = -1;  // -1: before the first window
  int micro_batch = -1;
  RankPhase phase = RankPhase::kIdle;
  // kCollective: the collective the rank is in. `seq` counts every collective this rank entered
  // in the window (1-based: the first is #1); in the other phases it is the count entered so
  // far, so (window, seq) orders ranks along the plan.
  std::string op;     // "all_reduce", ...
  std::string group;  // "tp", "dp", "world"
  int64_t seq = 0;
  double seconds = 0.0;  // time spent at this position so far
  // In a collective: time since the rank's connections to its peers last moved a byte; -1 when
  // not measured (a collective over shm, or not long enough yet to look).
  double quiet_seconds = -1.0;
};

// The one name table of the phases: what heartbeats carry (latchkey.v1.RankPosition.phase) and
// what WhereName says outside a collective.
struct RankPhaseNameEntry {
  RankPhase phase;
  const char* name;
};
inline constexpr RankPhaseNameEntry kRankPhaseNames[] = {
    {RankPhase::kIdle, "idle"},
    {RankPhase::kLatch, "latch"},
    {RankPhase::kCompute, "compute"},
    {RankPhase::kCollective, "collective"},
    {RankPhase::kCheckpoint, "checkpoint"},
    {RankPhase::kEval, "eval"},
};

// "idle", "latch", "compute", "collective", "checkpoint", "eval".
inline const char* RankPhaseName(RankPhase phase) {
  for (const auto& entry : kRankPhaseNames) {
    if (entry.phase == phase) return entry.name;
  }
  return "idle";
}

// The phase named `name`; nullopt for an unknown or empty name.
inline std::optional<RankPhase> RankPhaseFromName(std::string_view name) {
  for (const auto& entry : kRankPhaseNames) {
    if (name == entry.name) return entry.phase;
  }
  return std::nullopt;
}

// "compute", "all_reduce/tp #57", "latch", "checkpoint", "eval", "idle": the phase's name, or
// in a collective the collective.
inline std::string WhereName(const RankPosition& p) {
  if (p.phase == RankPhase::kCollective) {
    return p.op + "/" + p.group + " #" + std::to_string(p.seq);
  }
  return RankPhaseName(p.phase);
}

// A rank the coordinator declared stalled (JobInfo::stalled; `latchkey --json status`).
struct StalledRank {
  int rank = 0;
  int64_t window = -1;
  int micro_batch = -1;
  std::string where;     // WhereName of its position: compute, OP/GROUP #SEQ, latch, ...
  double seconds = 0.0;  // how long it had been there at the verdict
  int64_t attempt = 0;   // the attempt it stalled in (listed until attempt + 1 completed a step)
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_RANK_POSITION_H_
