#include "client/cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/error_info.h"
#include "common/job_spec.h"
#include "common/states.h"
#include "proto/wire.h"

namespace latchkey::cli {

std::string FormatTimestamp(absl::Time t) {
  if (t == absl::UnixEpoch()) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

namespace {

using google::protobuf::FieldDescriptor;

// A loss or gradient norm: "%.4f", or NaN / Inf / -Inf for a diverged step's (never "-nan").
std::string Measure(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.4f", v) : NonFiniteName(v);
}

// An int64 the proto JSON mapping printed as a string ("12"), as the number it is.
void StringToNumber(nlohmann::json& v, bool is_unsigned) {
  if (!v.is_string()) return;
  const std::string& text = v.get_ref<const std::string&>();
  try {
    if (is_unsigned) {
      v = static_cast<uint64_t>(std::stoull(text));
    } else {
      v = static_cast<int64_t>(std::stoll(text));
    }
  } catch (const std::exception&) {
    // Not a decimal integer: left as the mapping printed it.
  }
}

bool IsInt64(const FieldDescriptor* f) {
  return f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
         f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
}

// Walks `m` beside its JSON `j` and turns every int64/uint64 field (singular, repeated, map
// value, nested) into a JSON number. Well-known types (Timestamp, Duration) keep their string
// form, which is their JSON mapping's, not an int64's.
void Int64sAsNumbers(const google::protobuf::Message& m, nlohmann::json& j) {
  if (!j.is_object()) return;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = j.find(f->name());
    if (it == j.end()) continue;
    const bool is_unsigned = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
    if (f->is_map()) {
      const FieldDescriptor* value = f->message_type()->map_value();
      if (!it->is_object()) continue;
      if (IsInt64(value)) {
        for (auto& [k, v] : it->items())
          StringToNumber(v, value->cpp_type() == FieldDescriptor::CPPTYPE_UINT64);
      } else if (value->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        // Map entries in the JSON are keyed by the entry's key text: match them one by one.
        for (int e = 0; e < r->FieldSize(m, f); ++e) {
          const google::protobuf::Message& entry = r->GetRepeatedMessage(m, f, e);
          const google::protobuf::Reflection* er = entry.GetReflection();
          const FieldDescriptor* kf = entry.GetDescriptor()->map_key();
          std::string key;
          switch (kf->cpp_type()) {
            case FieldDescriptor::CPPTYPE_STRING:
              key = er->GetString(entry, kf);
              break;
            case FieldDescriptor::CPPTYPE_INT32:
              key = std::to_string(er->GetInt32(entry, kf));
              break;
            case FieldDescriptor::CPPTYPE_INT64:
              key = std::to_string(er->GetInt64(entry, kf));
              break;
            default:
              continue;
          }
          auto v = it->find(key);
          if (v != it->end()) {
            Int64sAsNumbers(er->GetMessage(entry, entry.GetDescriptor()->map_value()), *v);
          }
        }
      }
      continue;
    }
    if (IsInt64(f)) {
      if (f->is_repeated() && it->is_array()) {
        for (auto& v : *it) StringToNumber(v, is_unsigned);
      } else {
        StringToNumber(*it, is_unsigned);
      }
      continue;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->message_type()->file()->package() == "google.protobuf") continue;
    if (f->is_repeated()) {
      if (!it->is_array()) continue;
      const int n = std::min<int>(r->FieldSize(m, f), static_cast<int>(it->size()));
      for (int e = 0; e < n; ++e) Int64sAsNumbers(r->GetRepeatedMessage(m, f, e), (*it)[e]);
    } else if (r->HasField(m, f)) {
      Int64sAsNumbers(r->GetMessage(m, f), *it);
    }
  }
}

}  // namespace

nlohmann::json ToJsonValue(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  // Zero values and empty lists present: a script reads every field of every answer.
  opts.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) {
    return nlohmann::json::object();
  }
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return nlohmann::json::object();
  Int64sAsNumbers(m, j);
  return j;
}

std::string ToJson(const google::protobuf::Message& m) { return ToJsonValue(m).dump(); }

std::string PolicySummary(const LatchPolicy& p) {
  return absl::StrCat("kv_reduce=", KvReducePolicyName(p.kv_reduce), " gas=",
                      p.gradient_accumulation_steps > 0
                          ? std::to_string(p.gradient_accumulation_steps)
                          : std::string("spec"));
}

std::string JobTableHeader() {
  return absl::StrFormat("%-12s %-10s %5s %3s %3s %11s %-16s %s", "JOB", "STATE", "WORLD", "TP",
                         "DP", "STEPS", "KV_REDUCE", "CREATED");
}

std::string JobTableRow(const JobInfo& job) {
  return absl::StrFormat(
      "%-12s %-10s %5d %3d %3d %11s %-16s %s", job.job_id, JobStateName(job.state), job.world_size,
      job.tp, job.dp, absl::StrCat(job.steps_completed, "/", job.steps),
      KvReducePolicyName(job.policy.kv_reduce), FormatTimestamp(job.create_time));
}

std::string JobDetails(const JobInfo& job) {
  std::string out;
  absl::StrAppend(&out, "job:          ", job.job_id, "\n");
  if (!job.job_uid.empty()) absl::StrAppend(&out, "job_uid:      ", job.job_uid, "\n");
  absl::StrAppend(&out, "state:        ", JobStateName(job.state), "\n");
  if (!job.failure_reason.empty()) {
    absl::StrAppend(&out, "reason:       ", job.failure_reason, "\n");
  }
  const int world = job.world > 0 ? job.world : job.world_size;
  absl::StrAppend(&out, "world:        ", world, " (tp ", job.tp, " x dp ", job.dp, "), ",
                  job.workers_joined, " joined");
  if (world != job.world_size) absl::StrAppend(&out, "; the spec's world is ", job.world_size);
  absl::StrAppend(&out, "\n");
  absl::StrAppend(&out, "steps:        ", job.steps_completed, "/", job.steps, " completed, ",
                  job.windows_published, " latches published\n");
  absl::StrAppend(&out, "policy:       ", PolicySummary(job.policy),
                  " generation=", job.policy.generation, "\n");
  absl::StrAppend(
      &out, "rendezvous:   ", job.rendezvous_host.empty() ? "(rank 0's host)" : job.rendezvous_host,
      ":", job.rendezvous_port, "\n");
  absl::StrAppend(&out, "created:      ", FormatTimestamp(job.create_time), "\n");
  absl::StrAppend(&out, "updated:      ", FormatTimestamp(job.update_time), "\n");
  if (job.last_step) {
    const StepReport& s = job.last_step->report;
    absl::StrAppend(&out, "last step:    ", s.step, " loss ", Measure(s.loss));
    if (s.eval_loss) absl::StrAppend(&out, " eval_loss ", Measure(*s.eval_loss));
    absl::StrAppend(&out, " lr ", absl::StrFormat("%.3e", s.lr), " grad_norm ",
                    Measure(s.grad_norm), " kv_mode ", KvModeName(s.kv_mode),
                    " kv_allreduce_calls ", s.kv_allreduce_calls, " step_seconds ",
                    absl::StrFormat("%.3f", s.step_seconds), "\n");
  }
  absl::StrAppend(&out, "attempt:      ", job.attempt, " (restarts ", job.restarts, " of ",
                  job.max_restarts, ")");
  if (job.resume_step >= 0) absl::StrAppend(&out, ", resumed after step ", job.resume_step);
  absl::StrAppend(&out, "\n");
  // The attempts whose layout is not the spec's, so a shrink or grow shows in status.
  for (const AttemptSummary& a : job.attempts) {
    if (a.attempt == 1) continue;
    absl::StrAppend(&out, "  attempt ", a.attempt, ": world ", a.world, " (tp ", a.tp, " x dp ",
                    a.dp, ", gas ", a.gradient_accumulation_steps, "), resumed after step ",
                    a.resume_step, ": ", a.cause, "\n");
  }
  absl::StrAppend(&out, "checkpoint:   ",
                  job.last_checkpoint_step >= 0
                      ? absl::StrCat("last committed after step ", job.last_checkpoint_step)
                      : std::string("none committed"),
                  "\n");
  if (!job.last_recovery_reason.empty()) {
    absl::StrAppend(&out, "recovery:     ", job.last_recovery_reason, "\n");
  }
  for (const StalledRank& st : job.stalled) {
    absl::StrAppend(&out, "stalled:      ", StalledLine(st), "\n");
  }
  for (const StragglerInfo& s : job.stragglers) {
    absl::StrAppend(&out, "straggler:    ", StragglerLine(s), "\n");
  }
  if (!job.replica_micro_batches.empty()) {
    absl::StrAppend(&out, "split:        ", absl::StrJoin(job.replica_micro_batches, ","),
                    " micro-batches per DP replica (latchkey.stragglers.rebalance)\n");
  }
  absl::StrAppend(&out, "determinism:  ", job.determinism_violations,
                  job.determinism_violations == 1 ? " violation" : " violations",
                  " (re-run steps whose loss differed)\n");
  if (!job.slowest.empty()) {
    std::string windows;
    for (const WindowArrival& w : job.slowest) {
      if (!windows.empty()) windows += ", ";
      absl::StrAppend(&windows, "window ", w.window, " rank ", w.slowest_rank,
                      absl::StrFormat(" (+%.3f s)", w.lag_seconds));
    }
    absl::StrAppend(&out, "slowest:      ", windows, "\n");
  }
  for (const std::string& w : job.warnings) absl::StrAppend(&out, "warning:      ", w, "\n");
  if (!job.workers.empty()) {
    absl::StrAppend(&out, absl::StrFormat("%-6s %-8s %-8s %-8s %-10s %s\n", "RANK", "TP_RANK",
                                          "DP_RANK", "STATE", "STEPS", "WORKER@HOST"));
    for (const JobWorkerInfo& w : job.workers) {
      absl::StrAppend(
          &out, absl::StrFormat("%-6d %-8d %-8d %-8s %-10d %s@%s\n", w.rank, w.tp_rank, w.dp_rank,
                                WorkerStateName(w.state), w.steps_reported, w.worker_id, w.host));
    }
  }
  return out;
}

std::string ProgressLine(const JobInfo& job, const CompletedStep* step) {
  constexpr int kWidth = 24;
  const int64_t total = std::max<int64_t>(1, job.steps);
  const int filled = static_cast<int>(kWidth * std::min(job.steps_completed, total) / total);
  std::string bar = absl::StrCat("[", std::string(static_cast<size_t>(filled), '#'),
                                 std::string(static_cast<size_t>(kWidth - filled), '.'), "]");
  std::string out = absl::StrCat(bar, " step ", job.steps_completed, "/", job.steps);
  const CompletedStep* s = step ? step : (job.last_step ? &*job.last_step : nullptr);
  if (s) {
    const StepReport& r = s->report;
    const double tok_s = r.step_seconds > 0 ? r.tokens / r.step_seconds : 0.0;
    absl::StrAppend(&out, " loss ", Measure(r.loss));
    // Only on the steps that evaluated: a step without evaluation has no eval loss to show.
    if (r.eval_loss) absl::StrAppend(&out, " eval ", Measure(*r.eval_loss));
    absl::StrAppend(&out, absl::StrFormat(" lr %.3e tok/s %.0f kv-allreduce/step %d (%s)", r.lr,
                                          tok_s, r.kv_allreduce_calls, KvModeName(r.kv_mode)));
  }
  if (job.attempt > 1) absl::StrAppend(&out, " attempt ", job.attempt);
  if (job.world > 0 && job.world != job.world_size) {
    absl::StrAppend(&out, " world ", job.world, " (dp ", job.dp, ")");
  }
  absl::StrAppend(&out, " ", JobStateName(job.state));
  // What the job is recovering from, next to the word.
  if (job.state == JobState::kRecovering && !job.last_recovery_reason.empty()) {
    absl::StrAppend(&out, " (", job.last_recovery_reason, ")");
  }
  if (job.state == JobState::kPending) {
    absl::StrAppend(&out, " (", job.workers_joined, "/", job.world_size, " joined)");
  }
  return out;
}

std::string LatchTableHeader() {
  return absl::StrFormat("%-7s %-4s %-8s %-4s %-16s %-10s %s", "WINDOW", "GEN", "M", "N", "KV_MODE",
                         "NO_SYNC", "REASON");
}

std::string LatchRow(const Latch& l) {
  std::string mask;
  for (bool b : l.no_sync) mask.push_back(b ? '1' : '0');
  std::string reason = l.reason;
  if (!l.replica_micro_batches.empty()) {
    absl::StrAppend(&reason, " (micro-batches per DP replica ",
                    absl::StrJoin(l.replica_micro_batches, ","), ")");
  }
  return absl::StrFormat("%-7d %-4d %-8d %-4d %-16s %-10s %s", l.window, l.generation,
                         l.first_micro_batch, l.n, KvModeName(l.kv_mode), mask, reason);
}

std::string PolicyChangeLine(const AuditedPolicyChange& c) {
  return absl::StrCat("policy generation ", c.policy.generation, " from window ", c.first_window,
                      ": ", PolicySummary(c.policy), " at ", FormatTimestamp(c.change_time));
}

std::string StragglerLine(const StragglerInfo& s) {
  return absl::StrFormat("rank %d (host %s) %.2fx slower than the median since step %d", s.rank,
                         s.host.empty() ? "?" : s.host, s.slowdown, s.since_step);
}

std::string StalledLine(const StalledRank& s) {
  return absl::StrFormat("rank %d in window %d, micro-batch %d (%s) for %.1f s, attempt %d", s.rank,
                         s.window, s.micro_batch, s.where, s.seconds, s.attempt);
}

std::string StatusJson(const JobInfo& job) {
  nlohmann::json j = ToJsonValue(ToProto(job));
  j["attempt"] = std::max<int64_t>(1, job.attempt);  // a coordinator without attempts: 1
  // The current attempt's layout beside the spec's world_size (elastic recovery changes it).
  j["world_size"] = job.world_size;
  j["world"] = job.world > 0 ? job.world : job.world_size;
  j["dp"] = job.dp;
  j["tp"] = job.tp;
  nlohmann::json attempts = nlohmann::json::array();
  for (const AttemptSummary& a : job.attempts) {
    attempts.push_back({{"attempt", a.attempt},
                        {"world", a.world},
                        {"tp", a.tp},
                        {"dp", a.dp},
                        {"gradient_accumulation_steps", a.gradient_accumulation_steps},
                        {"resume_step", a.resume_step},
                        {"cause", a.cause}});
  }
  j["attempts"] = std::move(attempts);
  j["restarts"] = job.restarts;
  j["max_restarts"] = job.max_restarts;
  j["last_checkpoint_step"] = job.last_checkpoint_step;
  j["resume_step"] = job.resume_step;
  j["job_uid"] = job.job_uid;  // "" from a coordinator before job uids
  j["last_recovery_reason"] = job.last_recovery_reason;
  j["determinism_violations"] = job.determinism_violations;
  nlohmann::json stragglers = nlohmann::json::array();
  for (const StragglerInfo& s : job.stragglers) {
    stragglers.push_back({{"rank", s.rank},
                          {"host", s.host},
                          {"slowdown", s.slowdown},
                          {"since_step", s.since_step}});
  }
  j["stragglers"] = std::move(stragglers);
  j["replica_micro_batches"] = job.replica_micro_batches;
  nlohmann::json stalled = nlohmann::json::array();
  for (const StalledRank& s : job.stalled) {
    stalled.push_back({{"rank", s.rank},
                       {"window", s.window},
                       {"micro_batch", s.micro_batch},
                       {"where", s.where},
                       {"seconds", s.seconds},
                       {"attempt", s.attempt}});
  }
  j["stalled"] = std::move(stalled);
  nlohmann::json slowest = nlohmann::json::array();
  for (const WindowArrival& w : job.slowest) {
    slowest.push_back(
        {{"window", w.window}, {"slowest_rank", w.slowest_rank}, {"lag_seconds", w.lag_seconds}});
  }
  j["slowest"] = std::move(slowest);
  return j.dump();
}

std::string EventTableHeader() {
  return absl::StrFormat("%-20s %-7s %-22s %s", "TIME", "ATTEMPT", "EVENT", "MESSAGE");
}

std::string EventRow(const AuditedEvent& e) {
  return absl::StrFormat("%-20s %-7d %-22s %s", FormatTimestamp(e.time), e.attempt, e.kind,
                         e.message);
}

}  // namespace latchkey::cli
