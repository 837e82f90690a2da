// libFuzzer target: the proto -> core conversions of proto/wire.h on hostile bytes. The input
// is parsed as each request message the coordinator receives and each response a client or
// worker receives; every message that parses goes through the conversions its reader applies
// (and the spec of a SubmitJobRequest through ParseJobSpec, as the coordinator does).
#include <cstddef>
#include <cstdint>

#include "common/job_spec.h"
#include "latchkey/v1/job_service.pb.h"
#include "latchkey/v1/worker_service.pb.h"
#include "proto/wire.h"

namespace {

namespace v1 = latchkey::v1;

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* m) {
  return m->ParseFromArray(data, static_cast<int>(size));
}

void JobServiceRequests(const uint8_t* data, size_t size) {
  if (v1::SubmitJobRequest m; Parse(data, size, &m)) {
    (void)latchkey::ParseJobSpec(m.spec_json(), m.base_dir());
  }
  if (v1::ListJobsRequest m; Parse(data, size, &m)) {
    for (int s : m.states()) {
      if (v1::JobState_IsValid(s)) (void)latchkey::FromProto(static_cast<v1::JobState>(s));
    }
  }
  if (v1::UpdateJobPolicyRequest m; Parse(data, size, &m)) {
    (void)latchkey::FromProto(m.kv_reduce());
  }
}

void WorkerServiceRequests(const uint8_t* data, size_t size) {
  if (v1::ReportStepRequest m; Parse(data, size, &m)) {
    auto report = latchkey::FromProto(m);
    if (report.ok()) (void)latchkey::ToProto(*report);
  }
  if (v1::HeartbeatRequest m; Parse(data, size, &m)) {
    if (m.has_position()) (void)latchkey::ToProto(latchkey::FromProto(m.position()));
  }
  if (v1::ReportCheckpointRequest m; Parse(data, size, &m)) {
    auto report = latchkey::FromProto(m);
    if (report.ok()) (void)latchkey::ToProto(*report);
  }
}

void Responses(const uint8_t* data, size_t size) {
  if (v1::SubmitJobResponse m; Parse(data, size, &m)) (void)latchkey::FromProto(m);
  if (v1::GetJobResponse m; Parse(data, size, &m)) {
    (void)latchkey::ToProto(latchkey::FromProto(m.job()));
  }
  if (v1::ListJobsResponse m; Parse(data, size, &m)) {
    for (const v1::Job& j : m.jobs()) (void)latchkey::FromProto(j);
  }
  if (v1::UpdateJobPolicyResponse m; Parse(data, size, &m)) (void)latchkey::FromProto(m);
  if (v1::WatchJobResponse m; Parse(data, size, &m)) {
    (void)latchkey::ToProto(latchkey::FromProto(m));
  }
  if (v1::ListLatchesResponse m; Parse(data, size, &m)) {
    (void)latchkey::ToProto(latchkey::FromProto(m));
  }
  if (v1::JoinResponse m; Parse(data, size, &m)) {
    (void)latchkey::ToProto(latchkey::FromProto(m));
  }
  if (v1::WatchLatchesResponse m; Parse(data, size, &m)) {
    if (m.has_latch()) {
      (void)latchkey::ToProto(latchkey::FromProto(m.latch()));
      (void)latchkey::FromProtoTime(m.latch().publish_time());
    }
    if (m.has_job_ended()) (void)latchkey::FromProto(m.job_ended().state());
  }
  if (v1::HeartbeatResponse m; Parse(data, size, &m)) (void)latchkey::FromProto(m.state());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  JobServiceRequests(data, size);
  WorkerServiceRequests(data, size);
  Responses(data, size);
  return 0;
}
