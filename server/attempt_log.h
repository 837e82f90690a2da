// AttemptLog: the attempts of one job (docs/fault-tolerance.md). Part of the Coordinator's
// private implementation, beside LatchLog, RankTable and JobStateMachine.
//
// Owns the current attempt (from 1), how it began (restarts so far, the checkpoint it resumes
// from, the cause of its recovery), the layout each attempt runs (world size, tp x dp, gradient
// accumulation steps), when the current recovery began, the attempt fence (the workers of
// earlier attempts and the attempt each last held a rank in), and the re-run steps of this
// attempt already counted as determinism violations.
//
// The layout of a new attempt is chosen in Next() and nowhere else: the layout of the attempt
// before, unless the recovery is elastic (latchkey.elastic, docs/fault-tolerance.md "Elastic
// recovery"): then the largest dp' >= min_dp, at most the spec's dp, that the available workers
// fill in whole TP groups and that keeps the global batch with an integer GAS' (ElasticDp in
// common/job_spec.h). A new layout is a new layout epoch: its latches are decided afresh from
// its first window (layout_attempt names the attempt that began the layout an attempt runs).
//
// Persistence: the current attempt's number, restarts, resume step and manifest and cause are
// the JobRecord's fault-tolerance fields (attempt ... last_recovery_reason); every attempt after
// the first also has an AttemptRecord (its layout; Record writes both). The Coordinator persists
// them before Begin() makes them current, so the record follows the log as it follows
// LatchLog's position. The fence and the recovery's start are rebuilt on load (the fence from
// the stored workers' attempts), never stored.
//
// Errors: CheckFence refuses a call of another attempt with ABORTED, reason ATTEMPT_FENCED
// (common/error_info.h), metadata {job_attempt, worker_attempt}.
//
// Thread-safety: none; the Coordinator holds its lock around every call.
#ifndef LATCHKEY_SERVER_ATTEMPT_LOG_H_
#define LATCHKEY_SERVER_ATTEMPT_LOG_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/rank_grid.h"
#include "server/store.h"

namespace latchkey {

// How the ranks of one attempt are arranged.
struct AttemptLayout {
  int world_size = 1;
  int tp = 1;
  int dp = 1;
  int gradient_accumulation_steps = 1;  // the spec's n_s (the policy may change it per window)

  RankGrid grid() const { return RankGrid{world_size, tp}; }
  friend bool operator==(const AttemptLayout& a, const AttemptLayout& b) {
    return a.world_size == b.world_size && a.tp == b.tp && a.dp == b.dp &&
           a.gradient_accumulation_steps == b.gradient_accumulation_steps;
  }
  friend bool operator!=(const AttemptLayout& a, const AttemptLayout& b) { return !(a == b); }
};

// The layout a spec asks for (1 x 1 for the placeholder spec of a job this build cannot parse).
AttemptLayout SpecLayout(const JobSpec& spec);

class AttemptLog {
 public:
  // One attempt and how it began.
  struct Attempt {
    int64_t number = 1;
    int restarts = 0;                    // recoveries before it (a shrink or grow spends none)
    int64_t resume_step = -1;            // the checkpoint it resumes from; -1: the start
    std::string resume_manifest_sha256;  // that checkpoint's manifest
    std::string cause;                   // of its recovery; "" for the first attempt
    AttemptLayout layout;
    int64_t layout_attempt = 1;  // the attempt that began `layout` (itself for a new layout)
  };

  // What a recovery asks of Next().
  struct Recovery {
    std::string cause;
    int64_t checkpoint_step = -1;  // the committed checkpoint to resume from; -1: none
    std::string checkpoint_sha256;
    // Elastic recovery: the workers the next attempt can have (those joined and the spares).
    // -1: the layout of the current attempt, whatever the spec says (a plain recovery).
    int workers = -1;
    // A plain recovery spends a restart; a shrink that completes one, or a grow-back at a
    // checkpoint, does not.
    bool spend_restart = true;
    // A user's resume of an ended job: no restart spent, and the count starts again at 0 (the
    // spec's max_restarts counts from the resumed attempt).
    bool resume = false;
  };

  // The log of a stored job: its current attempt as `record` holds it, the earlier ones as
  // `stored` (the records of attempts >= 2; a missing one ran `spec_layout`, as every attempt
  // of a job stored before layouts were). `min_dp`: the spec's latchkey.elastic.min_dp (0: not
  // elastic).
  AttemptLog(const JobRecord& record, const AttemptLayout& spec_layout, int min_dp,
             const std::vector<AttemptRecord>& stored = {});

  const Attempt& current() const { return current_; }
  int64_t attempt() const { return current_.number; }
  int restarts() const { return current_.restarts; }
  int64_t resume_step() const { return current_.resume_step; }
  const AttemptLayout& layout() const { return current_.layout; }
  // The layout attempt `number` ran. REQUIRES: 1 <= number <= attempt().
  const AttemptLayout& layout(int64_t number) const;
  const AttemptLayout& spec_layout() const { return spec_layout_; }
  bool elastic() const { return min_dp_ > 0; }
  // Every attempt so far, attempt order (the current one last).
  const std::vector<Attempt>& history() const { return history_; }

  // The attempt a recovery begins after the current one, resuming from the committed
  // checkpoint the recovery names, in the layout chosen as the header says. Pure: nothing
  // changes until Begin. FAILED_PRECONDITION when an elastic recovery's workers fill no layout
  // (fewer than min_dp whole TP groups, or no dp' keeps an integer GAS').
  absl::StatusOr<Attempt> Next(const Recovery& recovery) const;
  // The dp an elastic recovery with `workers` would choose (0: none); the current dp when the
  // job is not elastic.
  int ElasticDpFor(int workers) const;
  // Writes `attempt`'s persisted fields into `record`, and its AttemptRecord into `out`.
  static void Record(const Attempt& attempt, JobRecord* record);
  static AttemptRecord ToRecord(const std::string& job_id, const Attempt& attempt,
                                absl::Time start);
  // Makes `next` (persisted already, see Record) the current attempt; its recovery began at
  // `now`. The per-attempt determinism record starts empty. The caller fences the old holders
  // (and, for a new layout, re-forms its rank table and re-decides the latches).
  void Begin(Attempt next, absl::Time now);

  // When the current recovery began (a restarted coordinator grants a fresh deadline).
  absl::Time recovery_start() const { return recovery_start_; }
  void set_recovery_start(absl::Time t) { recovery_start_ = t; }

  // The fence: `worker_id` held a rank in `attempt` (< the current one). Fence keeps the newest
  // attempt a worker is known by; Unfence: it joined the current attempt.
  void Fence(const std::string& worker_id, int64_t attempt);
  void Unfence(const std::string& worker_id) { fenced_.erase(worker_id); }
  // The attempt a call of `worker_id` naming `call_attempt` is of: `call_attempt`, or for 0 the
  // attempt the worker holds (`holds_rank`) or last held its rank in; 0 when unknown.
  int64_t AttemptOf(const std::string& worker_id, int64_t call_attempt, bool holds_rank) const;
  // OK when that attempt is the current one or unknown; else ABORTED ATTEMPT_FENCED
  //   "worker W is at attempt A; job J is at attempt B (fenced)".
  absl::Status CheckFence(const std::string& job_id, const std::string& worker_id,
                          int64_t call_attempt, bool holds_rank) const;

  // Re-run steps of the current attempt already counted as determinism violations.
  bool ViolationCounted(int64_t step) const { return violated_steps_.count(step) > 0; }
  void CountViolation(int64_t step) { violated_steps_.insert(step); }

 private:
  Attempt current_;
  AttemptLayout spec_layout_;
  int min_dp_ = 0;
  std::vector<Attempt> history_;
  absl::Time recovery_start_ = absl::UnixEpoch();
  std::map<std::string, int64_t> fenced_;  // worker id -> the attempt it last held a rank in
  std::set<int64_t> violated_steps_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_ATTEMPT_LOG_H_
