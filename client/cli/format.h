// Text rendering of coordinator messages for the CLI.
#ifndef LATCHKEY_CLIENT_CLI_FORMAT_H_
#define LATCHKEY_CLIENT_CLI_FORMAT_H_

#include <string>

#include "google/protobuf/message.h"
#include "latchkey/v1/job_service.pb.h"

namespace latchkey::cli {

std::string StateName(v1::JobState s);                         // "RUNNING"
std::string WorkerStateName(v1::WorkerState s);                // "active"
std::string KvModeName(v1::KvMode m);                          // "coalesced"
std::string KvReduceName(v1::KvReducePolicy p);                // "auto"
std::string FormatTime(const google::protobuf::Timestamp& t);  // RFC 3339, UTC
std::string ToJson(const google::protobuf::Message& m);        // one line

std::string JobTableHeader();
std::string JobTableRow(const v1::Job& job);
std::string JobDetails(const v1::Job& job);  // multi-line `status` output
// "[#####.....] step 12/20 loss 3.2100 tok/s 12345 kv-ar/step 1 RUNNING"
std::string ProgressLine(const v1::Job& job, const v1::StepSummary* step);
std::string LatchRow(const v1::Latch& latch);
std::string LatchTableHeader();

}  // namespace latchkey::cli

#endif  // LATCHKEY_CLIENT_CLI_FORMAT_H_
