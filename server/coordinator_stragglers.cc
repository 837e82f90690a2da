// The Coordinator's part in stragglers (docs/fault-tolerance.md "Stragglers"): every rank's
// step reports scored (StragglerTracker), the ranks named and cleared recorded in the job's
// audit and logged, the slowdown gauges, and each change of the latches' split audited.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {

void Coordinator::NoteSpeed(Job& job, int rank, const StepReport& report) {
  const std::optional<std::vector<StragglerTracker::Change>> changes =
      job.stragglers.Note(report.step, rank, report.replica_micro_batches, report.compute_seconds,
                          report.micro_batch_seconds);
  if (!changes) return;  // not every rank reported the step yet
  if (observer_ && job.stragglers.scored()) {
    observer_->RankSlowdowns(job.rec.job_id, job.stragglers.slowdowns());
  }
  for (const StragglerTracker::Change& c : *changes) {
    const std::string host = job.ranks.at(c.rank).host;
    const std::string message =
        c.named ? absl::StrFormat(
                      "rank %d (host %s) is %.2fx slower than the others' median since step %d "
                      "(threshold %.2fx in %d consecutive steps)",
                      c.rank, host, c.slowdown, c.since_step, job.spec.stragglers.threshold,
                      job.spec.stragglers.windows)
                : absl::StrFormat(
                      "rank %d (host %s) is no longer slow at step %d (%.2fx; slow "
                      "since step %d)",
                      c.rank, host, c.step, c.slowdown, c.since_step);
    RecordEvent(job, "straggler", message);
  }
  // A rank named or cleared changes the job's view now; the step itself wakes the watchers
  // (Advance) as it completes.
  if (!changes->empty()) Touch(job);
}

void Coordinator::NoteSplits(Job& job, const std::vector<PublishedLatch>& published) {
  for (const PublishedLatch& p : published) {
    const std::vector<int>& split = p.latch.replica_micro_batches;
    if (split == job.last_split) continue;
    const std::string was =
        job.last_split.empty() ? std::string("even") : absl::StrJoin(job.last_split, ",");
    const std::string now =
        split.empty() ? absl::StrCat("even (", p.latch.n, " each)") : absl::StrJoin(split, ",");
    const std::string message = absl::StrCat(
        "window ", p.latch.window, ": micro-batches per DP replica ", now, " (was ", was, ")");
    job.last_split = split;
    RecordEvent(job, "rebalance", message);
  }
}

}  // namespace latchkey
