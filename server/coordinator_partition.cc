// Coordinator: network partitions (docs/fault-tolerance.md "Partitions"). The ranks' probes of
// their peers (common/reachability.h) name a cut link instead of a stalled rank; a recovery a
// partition caused spends no restart; no attempt is formed across a cut link (the job waits,
// up to latchkey.partition_timeout_seconds); and a coordinator that hears from no rank of any
// job at once, across hosts, suspects its own network before it suspects every worker.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {
namespace {

// How often the waiting cause is written to the job's record while a link stays cut.
constexpr absl::Duration kWaitingWritten = absl::Seconds(5);

std::string Secs(absl::Duration d) { return absl::StrFormat("%.0f s", absl::ToDoubleSeconds(d)); }

}  // namespace

std::optional<PartitionVerdict> Coordinator::CurrentPartition(const Job& job,
                                                              absl::Time now) const {
  // A report counts while it is fresh: a rank probes every half second while it waits or
  // stalls, and its heartbeats carry the newest round.
  const absl::Duration fresh = 3 * HeartbeatInterval(job.world_size()) + absl::Seconds(2);
  std::vector<RankReach> ranks;
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (r.worker_id.empty()) continue;
    RankReach rr;
    rr.rank = i;
    rr.host = r.host;
    if (r.position) rr.where = WhereName(*r.position);
    if (r.reach && r.reach->peers_version == job.ranks.peers_version() &&
        now - r.reach_time <= fresh) {
      rr.reach = &*r.reach;
    }
    ranks.push_back(std::move(rr));
  }
  return FindPartition(ranks);
}

PeerList Coordinator::PeersOf(const Job& job) const {
  PeerList out;
  out.version = job.ranks.peers_version();
  if (!job.ranks.all_joined()) return out;
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (r.probe_port <= 0) return PeerList{out.version, {}};  // a rank that cannot probe
    out.peers.push_back({i, r.host, r.probe_port});
  }
  return out;
}

absl::Status Coordinator::MaybeStart(Job& job, absl::Time now) {
  const JobState state = job.rec.state;
  if ((state != JobState::kPending && state != JobState::kRecovering &&
       state != JobState::kPreempted) ||
      !job.ranks.all_joined()) {
    return absl::OkStatus();
  }
  // Before any collective: a tensor-parallel group across nodes would run its per-layer
  // all-reduces over the network. The layout does not change by waiting: the job fails.
  if (std::optional<std::string> why = TensorParallelAcrossNodes(job.ranks)) {
    Log(absl::StrCat(job.rec.job_id, ": ", *why));
    const JobEventRecord event = Event(job, "topology", *why);
    return EndJob(job, JobState::kFailed, *why, WorkerState::kDone, &event);
  }
  // Ranks on one host reach each other; ranks that cannot probe (an older worker) form as
  // before.
  std::set<std::string> hosts;
  bool probing = true;
  for (int i = 0; i < job.world_size(); ++i) {
    hosts.insert(job.ranks.at(i).host);
    probing = probing && job.ranks.at(i).probe_port > 0;
  }
  if (!probing || hosts.size() < 2) {
    job.partition.reset();
    return StartJob(job);
  }
  std::optional<PartitionVerdict> cut = CurrentPartition(job, now);
  if (!cut) {
    for (int i = 0; i < job.world_size(); ++i) {
      const RankTable::Rank& r = job.ranks.at(i);
      if (!r.reach || r.reach->peers_version != job.ranks.peers_version()) {
        return absl::OkStatus();  // not every rank has probed the current peers yet
      }
    }
    if (job.partition) {
      Log(absl::StrCat(job.rec.job_id, ": every rank reaches every other again after ",
                       Secs(now - job.partition->since), "; starting attempt ",
                       job.attempts.attempt()));
    }
    job.partition.reset();
    return StartJob(job);
  }
  if (!job.partition) job.partition = Job::PartitionWait{now - absl::Seconds(cut->Longest())};
  const absl::Duration waited = now - job.partition->since;
  // The wait counts from the partition's start (the probes of restarted ranks count afresh).
  for (CutLink& l : cut->links) l.seconds = std::max(l.seconds, absl::ToDoubleSeconds(waited));
  if (waited > absl::Seconds(job.spec.partition_timeout_seconds)) {
    const std::string why = absl::StrCat("network partition: ", cut->Links(),
                                         " stayed cut past latchkey.partition_timeout_seconds (",
                                         job.spec.partition_timeout_seconds, " s)");
    Log(absl::StrCat(job.rec.job_id, ": ", why));
    const JobEventRecord event = Event(job, "partition", why);
    return EndJob(job, JobState::kFailed, why, WorkerState::kDone, &event);
  }
  if (now - job.partition->written >= kWaitingWritten) {
    JobRecord next = job.rec;
    next.last_recovery_reason = absl::StrCat("waiting for ", cut->Links());
    next.update_time = now;
    LK_RETURN_IF_ERROR(store_->UpdateJob(next));
    job.rec = std::move(next);
    job.partition->written = now;
    Log(absl::StrCat(job.rec.job_id, ": attempt ", job.attempts.attempt(), " ",
                     job.rec.last_recovery_reason, " (", cut->message, "); no restart spent"));
    Touch(job);
  }
  return absl::OkStatus();
}

bool Coordinator::SuspectOwnNetwork(absl::Time now) {
  int ranks = 0;
  bool heard = false;
  std::set<std::string> hosts;
  double timeout = 0;
  for (const auto& [id, job] : jobs_) {
    if (job->rec.state != JobState::kRunning || !job->ranks.all_joined()) continue;
    timeout = timeout == 0 ? job->spec.partition_timeout_seconds
                           : std::min(timeout, job->spec.partition_timeout_seconds);
    for (int i = 0; i < job->world_size(); ++i) {
      const RankTable::Rank& r = job->ranks.at(i);
      ++ranks;
      hosts.insert(r.host);
      if (now - r.heartbeat_time <= kAllSilentAfter) heard = true;
    }
  }
  const bool silent = ranks > 0 && hosts.size() >= 2 && !heard;
  if (!silent) {
    if (suspect_since_ != absl::InfinitePast()) {
      const int granted = GrantGrace(now);
      Log(absl::StrCat("heard from ranks again after ", Secs(now - suspect_since_),
                       " of silence from every rank: ", granted,
                       granted == 1 ? " live job gets" : " live jobs get",
                       " a fresh liveness and hang grace period, judged on what its ranks report"));
      suspect_since_ = absl::InfinitePast();
    }
    return false;
  }
  if (suspect_since_ == absl::InfinitePast()) {
    suspect_since_ = now;
    Log(absl::StrCat("every rank of every live job (", ranks, " ranks on ", hosts.size(),
                     " hosts) fell silent at once: suspecting this coordinator's own network; no "
                     "verdict and no new attempt until a rank is heard again (at most ",
                     timeout, " s)"));
  }
  return now - suspect_since_ <= absl::Seconds(timeout);
}

}  // namespace latchkey
