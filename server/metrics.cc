#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace latchkey {

CoordinatorMetrics::CoordinatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& jobs = prometheus::BuildGauge()
                   .Name("latchkey_jobs")
                   .Help("Jobs known to the coordinator, by state.")
                   .Register(*registry_);
  for (JobState s : kAllJobStates) {
    jobs_[s] = &jobs.Add({{"state", JobStateName(s)}});
  }
  auto& workers = prometheus::BuildGauge()
                      .Name("latchkey_workers")
                      .Help("Workers admitted to jobs, by state.")
                      .Register(*registry_);
  for (WorkerState s : {WorkerState::kJoined, WorkerState::kActive, WorkerState::kDone,
                        WorkerState::kLost, WorkerState::kFailed}) {
    workers_[s] = &workers.Add({{"state", WorkerStateName(s)}});
  }
  auto& latches = prometheus::BuildCounter()
                      .Name("latchkey_latches_published_total")
                      .Help("Window latches published (persisted and servable), by K/V mode.")
                      .Register(*registry_);
  for (KvMode m : {KvMode::kPerMicroBatch, KvMode::kDeferred, KvMode::kCoalesced}) {
    latches_[m] = &latches.Add({{"kv_mode", KvModeName(m)}});
  }
  stalled_ = &prometheus::BuildGauge()
                  .Name("latchkey_stalled_ranks")
                  .Help("Ranks the hang detector declared stalled, listed on live jobs.")
                  .Register(*registry_)
                  .Add({});
  unreachable_ = &prometheus::BuildGauge()
                      .Name("latchkey_unreachable_peers")
                      .Help(
                          "(rank, peer) pairs that live jobs' ranks report unreachable now: a "
                          "cut link between hosts.")
                      .Register(*registry_)
                      .Add({});
  restarts_ = &prometheus::BuildCounter()
                   .Name("latchkey_job_restarts_total")
                   .Help("Recoveries begun: a job restarted every rank in a new attempt.")
                   .Register(*registry_)
                   .Add({});
  arrival_lag_ = &prometheus::BuildHistogram()
                      .Name("latchkey_boundary_arrival_lag_seconds")
                      .Help(
                          "Per window, how much later the slowest rank reached the first boundary "
                          "collective than the fastest (max - min of the ranks' waits there).")
                      .Register(*registry_)
                      .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05,
                                                                       0.1, 0.5, 1, 5, 10, 30, 60});
  commit_ = &prometheus::BuildHistogram()
                 .Name("latchkey_report_commit_seconds")
                 .Help(
                     "Group commits of step reports (one SQLite transaction each): the seconds "
                     "each took.")
                 .Register(*registry_)
                 .Add({}, prometheus::Histogram::BucketBoundaries{0.0001, 0.0005, 0.001, 0.005,
                                                                  0.01, 0.05, 0.1, 0.5, 1, 5});
  lock_held_by_commits_ =
      &prometheus::BuildCounter()
           .Name("latchkey_coordinator_lock_held_by_commits_seconds_total")
           .Help(
               "Seconds group commits held the coordinator's lock (every RPC waits meanwhile); "
               "0 while the database is in WAL (commits beside the other calls).")
           .Register(*registry_)
           .Add({});
  slowdown_family_ = &prometheus::BuildGauge()
                          .Name("latchkey_rank_slowdown")
                          .Help(
                              "Per rank of a live job: its compute time per micro-batch over the "
                              "median of the other ranks' (1 = typical; a straggler is named past "
                              "latchkey.stragglers.threshold).")
                          .Register(*registry_);
}

void CoordinatorMetrics::RankSlowdowns(const std::string& job_id,
                                       const std::vector<double>& slowdowns) {
  absl::MutexLock lock(&slowdown_mu_);
  std::vector<prometheus::Gauge*>& gauges = slowdowns_[job_id];
  if (gauges.size() != slowdowns.size()) {  // a new job, a new layout, or the job ended
    for (prometheus::Gauge* g : gauges) slowdown_family_->Remove(g);
    gauges.clear();
    for (size_t r = 0; r < slowdowns.size(); ++r) {
      gauges.push_back(&slowdown_family_->Add({{"job", job_id}, {"rank", std::to_string(r)}}));
    }
  }
  for (size_t r = 0; r < slowdowns.size(); ++r) gauges[r]->Set(slowdowns[r]);
  if (slowdowns.empty()) slowdowns_.erase(job_id);
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::AddJobs(JobState state, int delta) { jobs_.at(state)->Increment(delta); }

void CoordinatorMetrics::AddWorkers(WorkerState state, int delta) {
  workers_.at(state)->Increment(delta);
}

void CoordinatorMetrics::LatchPublished(KvMode mode) { latches_.at(mode)->Increment(); }

void CoordinatorMetrics::AddStalledRanks(int delta) { stalled_->Increment(delta); }

void CoordinatorMetrics::UnreachablePeers(int pairs) { unreachable_->Set(pairs); }

void CoordinatorMetrics::JobRestarted() { restarts_->Increment(); }

void CoordinatorMetrics::BoundaryArrivalLag(double seconds) { arrival_lag_->Observe(seconds); }

void CoordinatorMetrics::GroupCommitted(double seconds, bool lock_held) {
  commit_->Observe(seconds);
  if (lock_held) lock_held_by_commits_->Increment(seconds);
}

std::string CoordinatorMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace latchkey
