// `latchkey up`'s summary over rank 0's JSONL: a diverged run's records carry null for a loss or
// gradient norm that was not finite (JSON has no NaN); the summary reads them as such, names the
// step, and never throws (before: nlohmann's type_error, "type must be number, but is null",
// ended `up` with `terminate called`).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "client/cli/up.h"

namespace latchkey::cli {
namespace {

std::string WriteJsonl(const std::string& name, const std::string& text) {
  const std::string dir = ::testing::TempDir() + "/up-summary-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

constexpr char kStep0[] =
    R"({"rank":0,"step":0,"micro_batches":1,"loss":5.5452,"grad_norm":1.25,)"
    R"("kv_mode":"coalesced","kv_allreduce_calls":1,"collective_calls":{"all_reduce/tp":17},)"
    R"("step_seconds":0.5,"tokens":128,"lr":1000000000.0,"eval_loss":5.5,)"
    R"("peak_memory_bytes":1048576,"activation_memory_bytes":524288})";
// The diverged step: loss and grad_norm null, no eval_loss (nothing was evaluated).
constexpr char kStep1[] =
    R"({"rank":0,"step":1,"micro_batches":1,"loss":null,"grad_norm":null,)"
    R"("kv_mode":"coalesced","kv_allreduce_calls":1,"collective_calls":{"all_reduce/tp":17},)"
    R"("step_seconds":0.25,"tokens":128,"lr":1000000000.0,)"
    R"("peak_memory_bytes":2097152,"activation_memory_bytes":524288})";

TEST(UpSummary, ADivergedStepsNullLossIsNamedNotThrown) {
  const std::string path = WriteJsonl("steps-0.jsonl", std::string(kStep0) + "\n" + kStep1 + "\n");
  JobInfo job;
  job.restarts = 0;
  job.attempt = 1;
  job.steps_completed = 2;  // the diverged step is the job's last (its report is stored)
  std::string text;
  ASSERT_NO_THROW(text = UpSummary(path, &job, 0, 0));
  EXPECT_NE(text.find("loss first -> final                  5.5452 -> not finite\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("diverged at                          step 1 (loss or grad_norm not "
                      "finite; not applied)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("eval loss first -> final             5.5000 -> 5.5000  (1 evaluations"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("restarts                             0 (attempt 1)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("peak memory, rank 0                  2.0 MiB\n"), std::string::npos) << text;
  EXPECT_NE(text.find("collectives/step all_reduce/tp       17.0\n"), std::string::npos) << text;
}

// A record with a field of another type (or none) is read around, never thrown on.
TEST(UpSummary, FieldsOfAnotherTypeAreSkipped) {
  const std::string path = WriteJsonl(
      "other.jsonl",
      R"({"rank":0,"step":0,"loss":"NaN","grad_norm":null,"step_seconds":null,"tokens":null})"
      "\n");
  std::string text;
  ASSERT_NO_THROW(text = UpSummary(path, nullptr, 0, 0));
  EXPECT_NE(text.find("not finite -> not finite"), std::string::npos) << text;
  EXPECT_NE(text.find("diverged at                          step 0"), std::string::npos) << text;
}

TEST(UpSummary, NoStepsNoSummary) {
  EXPECT_EQ(UpSummary(WriteJsonl("empty.jsonl", ""), nullptr, 0, 0), "");
}

}  // namespace
}  // namespace latchkey::cli
