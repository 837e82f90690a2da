#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
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

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsEndpoint> ep(new MetricsEndpoint());
  try {
    ep->exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-port ", port, ": cannot serve on ", host, ": ", e.what()));
  }
  ep->exposer_->RegisterCollectable(registry);
  auto ports = ep->exposer_->GetListeningPorts();
  ep->port_ = ports.empty() ? port : ports.front();
  return ep;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace latchkey
