#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
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
  for (JobState s : {JobState::kPending, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled}) {
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
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::AddJobs(JobState state, int delta) { jobs_.at(state)->Increment(delta); }

void CoordinatorMetrics::AddWorkers(WorkerState state, int delta) {
  workers_.at(state)->Increment(delta);
}

void CoordinatorMetrics::LatchPublished(KvMode mode) { latches_.at(mode)->Increment(); }

std::string CoordinatorMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace latchkey
