// StragglerTracker: how fast each rank of one job computes, which ranks are slow, and how a
// window's micro-batches are split over the DP replicas (docs/fault-tolerance.md
// "Stragglers"). Part of the Coordinator's private implementation; derived state kept in memory
// only: a restarted coordinator measures again, and splits evenly until it has.
//
// Two scores, each the median of a rank's last `sample_steps` steps, per micro-batch of its
// replica's share (StepReport::replica_micro_batches):
//   compute  StepReport::compute_seconds: the time inside every collective left out, so a rank
//            that waits for a slow peer is not slow;
//   pace     StepReport::micro_batch_seconds: only the waits on other replicas (DP and world
//            collectives) left out. A replica's pace is its ranks' highest: how long the
//            replica, TP collectives included, takes per micro-batch.
// Once every rank reported a step, a rank's slowdown is its compute score over the median of the
// other ranks', and a replica's its pace over the median of the other replicas'. A rank over
// `threshold` in `windows` consecutive steps is named (since the first of them); so are the
// ranks of a replica over it, unless one of its ranks is named on its own (the others wait for
// that one: when the ranks of a replica share a processor, a slow replica's time shows up as
// waits inside its TP collectives, which the rank score leaves out). Named ranks and replicas
// under the threshold in as many steps are cleared.
//
// The split (latchkey.stragglers.rebalance): by the replicas' paces.
// The window's n * DP micro-batches are dealt one at a time to the replica that would finish
// its share soonest, after one each: the split that minimises the slowest replica's time
// (Split). The current split is replaced only by one predicted at least kMinGain faster, so
// noise does not move it; even paces give the even split back.
//
// Thread-safety: none; the Coordinator holds its lock around every call.
#ifndef LATCHKEY_SERVER_STRAGGLERS_H_
#define LATCHKEY_SERVER_STRAGGLERS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "common/job_spec.h"
#include "common/rank_grid.h"

namespace latchkey {

class StragglerTracker {
 public:
  // The predicted gain (1 - new window time / current window time) a new split must bring.
  static constexpr double kMinGain = 0.05;

  // A rank named slow: `slowdown` its latest, since the first step of its streak.
  struct Named {
    int rank = 0;
    double slowdown = 0.0;
    int64_t since_step = 0;
  };
  // A rank named or cleared by a step (for the job's audit log).
  struct Change {
    int rank = 0;
    bool named = false;  // false: cleared
    double slowdown = 0.0;
    int64_t step = 0;  // the step that decided it
    int64_t since_step = 0;
  };

  StragglerTracker(const StragglerConfig& config, const RankGrid& grid)
      : config_(config), grid_(grid) {}

  // A new attempt: partial steps are forgotten (the attempt re-runs them); a new layout starts
  // over (another grid: other ranks, other replicas).
  void NewAttempt(const RankGrid& grid);

  // Rank `rank`'s first report of `step` in this attempt: it computed `micro_batches` (its
  // replica's share) in `compute_seconds` (pace `micro_batch_seconds`). A report without them
  // (micro_batches 0: a worker that does not measure) scores nothing. Once every rank reported
  // the step, what it changed (slowdowns() are then this step's); nullopt before.
  std::optional<std::vector<Change>> Note(int64_t step, int rank, int micro_batches,
                                          double compute_seconds, double micro_batch_seconds);

  // The ranks named now, in rank order.
  std::vector<Named> named() const;
  // Each rank's latest slowdown (0 before its first scored step); scored(): some rank has one
  // (workers that do not measure, e.g. a load generator's, leave every rank unscored).
  const std::vector<double>& slowdowns() const { return slowdown_; }
  bool scored() const { return scored_; }

  // The split for a window of `n` micro-batches per replica (Latch::replica_micro_batches):
  // empty for even. Moves the current split when a better one is due (see above).
  std::vector<int> SplitFor(int n);

  // The split of n * dp micro-batches (dp = pace.size()) that minimises max(c_d * pace_d), at
  // least one each; ties go to the lower dp rank. Exposed for tests.
  static std::vector<int> Split(const std::vector<double>& pace, int n);

 private:
  // Consecutive scored steps over and under the threshold, of a rank or a replica.
  struct Streak {
    int over = 0;
    int under = 0;
    bool named = false;
    int64_t since_step = 0;
    double slowdown = 0.0;
    // One step's verdict: true when it was named by this step.
    bool Judge(double slowdown, const StragglerConfig& config, int64_t step, bool* cleared);
  };
  struct Rank {
    std::deque<double> compute;  // seconds per micro-batch, newest last
    std::deque<double> pace;
    Streak streak;
  };
  static double Median(const std::deque<double>& samples);  // 0 without any
  double Pace(int dp_rank) const;  // the replica's: its ranks' highest pace score
  // Each score's slowdown over the median of the others' (0 where a score is 0).
  static std::vector<double> OverOthers(const std::vector<double>& scores);
  std::vector<Change> Judge(int64_t step);

  StragglerConfig config_;
  RankGrid grid_;
  std::vector<Rank> ranks_ = std::vector<Rank>(static_cast<size_t>(grid_.world_size));
  std::vector<Streak> replicas_ = std::vector<Streak>(static_cast<size_t>(grid_.dp()));
  std::map<int, Named> named_;  // rank -> what names it now
  std::vector<double> slowdown_ = std::vector<double>(static_cast<size_t>(grid_.world_size));
  std::map<int64_t, int> partial_;  // step -> ranks that reported it
  std::vector<int> split_;          // the current split; empty = even
  int split_n_ = 0;                 // the n it was chosen for
  bool scored_ = false;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_STRAGGLERS_H_
