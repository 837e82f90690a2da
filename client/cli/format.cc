#include "client/cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace latchkey::cli {
namespace {

// "JOB_STATE_RUNNING" -> "RUNNING" (prefix dropped).
std::string AfterPrefix(const std::string& name, const std::string& prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

}  // namespace

std::string StateName(v1::JobState s) { return AfterPrefix(v1::JobState_Name(s), "JOB_STATE_"); }

std::string WorkerStateName(v1::WorkerState s) {
  return absl::AsciiStrToLower(AfterPrefix(v1::WorkerState_Name(s), "WORKER_STATE_"));
}

std::string KvModeName(v1::KvMode m) {
  return absl::AsciiStrToLower(AfterPrefix(v1::KvMode_Name(m), "KV_MODE_"));
}

std::string KvReduceName(v1::KvReducePolicy p) {
  return absl::AsciiStrToLower(AfterPrefix(v1::KvReducePolicy_Name(p), "KV_REDUCE_POLICY_"));
}

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) return "{}";
  return out;
}

std::string JobTableHeader() {
  return absl::StrFormat("%-12s %-10s %5s %3s %3s %11s %-16s %s", "JOB", "STATE", "WORLD", "TP",
                         "DP", "STEPS", "KV_REDUCE", "CREATED");
}

std::string JobTableRow(const v1::Job& job) {
  return absl::StrFormat("%-12s %-10s %5d %3d %3d %11s %-16s %s", job.job_id(),
                         StateName(job.state()), job.world_size(), job.tp(), job.dp(),
                         absl::StrCat(job.steps_completed(), "/", job.steps()),
                         KvReduceName(job.policy().kv_reduce()), FormatTime(job.create_time()));
}

std::string JobDetails(const v1::Job& job) {
  std::string out;
  absl::StrAppend(&out, "job:          ", job.job_id(), "\n");
  absl::StrAppend(&out, "state:        ", StateName(job.state()), "\n");
  if (!job.failure_reason().empty()) {
    absl::StrAppend(&out, "reason:       ", job.failure_reason(), "\n");
  }
  absl::StrAppend(&out, "world:        ", job.world_size(), " (tp ", job.tp(), " x dp ", job.dp(),
                  "), ", job.workers_joined(), " joined\n");
  absl::StrAppend(&out, "steps:        ", job.steps_completed(), "/", job.steps(), " completed, ",
                  job.windows_published(), " latches published\n");
  const v1::JobPolicy& p = job.policy();
  absl::StrAppend(&out, "policy:       kv_reduce=", KvReduceName(p.kv_reduce()), " gas=",
                  p.gradient_accumulation_steps() > 0
                      ? std::to_string(p.gradient_accumulation_steps())
                      : std::string("spec"),
                  " generation=", p.generation(), "\n");
  absl::StrAppend(&out, "rendezvous:   ",
                  job.rendezvous().host().empty() ? "(rank 0's host)" : job.rendezvous().host(),
                  ":", job.rendezvous().port(), "\n");
  absl::StrAppend(&out, "created:      ", FormatTime(job.create_time()), "\n");
  absl::StrAppend(&out, "updated:      ", FormatTime(job.update_time()), "\n");
  if (job.has_last_step()) {
    const v1::StepSummary& s = job.last_step();
    absl::StrAppend(&out, "last step:    ", s.step(), " loss ", absl::StrFormat("%.4f", s.loss()),
                    " grad_norm ", absl::StrFormat("%.4f", s.grad_norm()), " kv_mode ",
                    KvModeName(s.kv_mode()), " kv_allreduce_calls ", s.kv_allreduce_calls(),
                    " step_seconds ", absl::StrFormat("%.3f", s.step_seconds()), "\n");
  }
  for (const std::string& w : job.warnings()) absl::StrAppend(&out, "warning:      ", w, "\n");
  if (job.workers_size() > 0) {
    absl::StrAppend(&out, absl::StrFormat("%-6s %-8s %-8s %-8s %-10s %s\n", "RANK", "TP_RANK",
                                          "DP_RANK", "STATE", "STEPS", "WORKER@HOST"));
    for (const v1::WorkerInfo& w : job.workers()) {
      absl::StrAppend(&out, absl::StrFormat("%-6d %-8d %-8d %-8s %-10d %s@%s\n", w.rank(),
                                            w.tp_rank(), w.dp_rank(), WorkerStateName(w.state()),
                                            w.steps_reported(), w.worker_id(), w.host()));
    }
  }
  return out;
}

std::string ProgressLine(const v1::Job& job, const v1::StepSummary* step) {
  constexpr int kWidth = 24;
  const int64_t total = std::max<int64_t>(1, job.steps());
  const int filled = static_cast<int>(kWidth * std::min(job.steps_completed(), total) / total);
  std::string bar = absl::StrCat("[", std::string(static_cast<size_t>(filled), '#'),
                                 std::string(static_cast<size_t>(kWidth - filled), '.'), "]");
  std::string out = absl::StrCat(bar, " step ", job.steps_completed(), "/", job.steps());
  const v1::StepSummary* s = step ? step : (job.has_last_step() ? &job.last_step() : nullptr);
  if (s) {
    const double tok_s = s->step_seconds() > 0 ? s->tokens() / s->step_seconds() : 0.0;
    absl::StrAppend(
        &out, absl::StrFormat(" loss %.4f tok/s %.0f kv-allreduce/step %d (%s)", s->loss(), tok_s,
                              s->kv_allreduce_calls(), KvModeName(s->kv_mode())));
  }
  absl::StrAppend(&out, " ", StateName(job.state()));
  if (job.state() == v1::JOB_STATE_PENDING) {
    absl::StrAppend(&out, " (", job.workers_joined(), "/", job.world_size(), " joined)");
  }
  return out;
}

std::string LatchTableHeader() {
  return absl::StrFormat("%-7s %-4s %-8s %-4s %-16s %-10s %s", "WINDOW", "GEN", "M", "N", "KV_MODE",
                         "NO_SYNC", "REASON");
}

std::string LatchRow(const v1::Latch& l) {
  std::string mask;
  for (bool b : l.no_sync()) mask.push_back(b ? '1' : '0');
  return absl::StrFormat("%-7d %-4d %-8d %-4d %-16s %-10s %s", l.window(), l.generation(),
                         l.first_micro_batch(), l.micro_batches(), KvModeName(l.kv_mode()), mask,
                         l.reason());
}

}  // namespace latchkey::cli
