// Text rendering of what JobClient returns, for the CLI. States, K/V modes and policies are
// spelled with the one lowercase name table of common/ ("running", "coalesced", "auto"); the
// `--json` output is the wire's proto JSON in one mapping (ToJsonValue), whose enums keep their
// proto names.
#ifndef LATCHKEY_CLIENT_CLI_FORMAT_H_
#define LATCHKEY_CLIENT_CLI_FORMAT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/time/time.h"
#include "common/job_info.h"
#include "google/protobuf/message.h"

namespace latchkey::cli {

std::string FormatTimestamp(absl::Time t);  // RFC 3339, UTC; "-" when unset
// The one JSON mapping of every `--json` output (docs/cli.md): the message's proto JSON with
// proto field names, every field present (zero values, empty lists as []), int64 fields as JSON
// numbers (the proto mapping's strings converted), enums by their proto names, timestamps as
// RFC 3339 strings. ToJson: the same on one line.
nlohmann::json ToJsonValue(const google::protobuf::Message& m);
std::string ToJson(const google::protobuf::Message& m);

std::string JobTableHeader();
std::string JobTableRow(const JobInfo& job);
std::string JobDetails(const JobInfo& job);  // multi-line `status` output
// `latchkey --json status`: the job's proto JSON on one line, with the fault-tolerance fields
// always present as numbers (attempt from 1, restarts, max_restarts, last_checkpoint_step -1 if
// none, resume_step, determinism_violations) and arrays (stalled: [{rank, window, micro_batch,
// where, seconds, attempt}], slowest: [{window, slowest_rank, lag_seconds}]), [] when empty, and
// job_uid always present (a string; "" from a coordinator before job uids).
std::string StatusJson(const JobInfo& job);
// "rank 1 in window 12, micro-batch 3 (compute) for 14.0 s, attempt 1".
std::string StalledLine(const StalledRank& s);
// "rank 1 (host h) 1.93x slower than the median since step 12" (status, watch).
std::string StragglerLine(const StragglerInfo& s);
// "[#####.....] step 12/20 loss 3.2100 eval 3.3012 lr 2.500e-04 tok/s 12345 kv-allreduce/step 1
// (coalesced) running"; "eval" only when the step ran an evaluation, "attempt A" before the
// state from the job's second attempt on, the cause after "recovering" ("recovering (rank 1:
// process exited: killed by signal 9)").
std::string ProgressLine(const JobInfo& job, const CompletedStep* step);
std::string LatchTableHeader();
std::string LatchRow(const Latch& latch);
std::string PolicyChangeLine(const AuditedPolicyChange& change);
std::string EventTableHeader();
std::string EventRow(const AuditedEvent& event);  // time, attempt, kind, message
// "kv_reduce=auto gas=spec" (gas 0: the spec's gradient_accumulation_steps).
std::string PolicySummary(const LatchPolicy& policy);

}  // namespace latchkey::cli

#endif  // LATCHKEY_CLIENT_CLI_FORMAT_H_
