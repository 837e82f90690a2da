// The one JSON mapping of every `--json` output (docs/cli.md "JSON output"), parsed from the real
// commands against a real coordinator: each command's documented keys present with their JSON
// types, int64 fields as numbers (never "12"), zero values present, empty results as [].
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_support.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;

// No value anywhere is an integer printed as a string (the proto mapping's int64 form).
void ExpectNoQuotedIntegers(const json& j, const std::string& where, const std::string& path = "") {
  static const std::regex integer("-?[0-9]+");
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "join_token" || it.key() == "spec_json" || it.key() == "job_id") continue;
      ExpectNoQuotedIntegers(*it, where, path + "." + it.key());
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      ExpectNoQuotedIntegers(j[i], where, path + "[" + std::to_string(i) + "]");
    }
  } else if (j.is_string()) {
    EXPECT_FALSE(std::regex_match(j.get<std::string>(), integer))
        << where << ": " << path << " is the string " << j.dump() << ", not a number";
  }
}

enum class T { kString, kNumber, kBool, kArray, kObject };

bool IsA(const json& v, T t) {
  switch (t) {
    case T::kString:
      return v.is_string();
    case T::kNumber:
      return v.is_number();
    case T::kBool:
      return v.is_boolean();
    case T::kArray:
      return v.is_array();
    case T::kObject:
      return v.is_object();
  }
  return false;
}

void ExpectKeys(const json& j, const std::map<std::string, T>& keys, const std::string& where) {
  ASSERT_TRUE(j.is_object()) << where << ": " << j.dump();
  for (const auto& [k, t] : keys) {
    ASSERT_TRUE(j.contains(k)) << where << ": no \"" << k << "\" in " << j.dump();
    EXPECT_TRUE(IsA(j[k], t)) << where << ": \"" << k << "\" is " << j[k].dump();
  }
}

// docs/cli.md "A job": every key, present also when zero or empty.
const std::map<std::string, T>& JobKeys() {
  static const std::map<std::string, T> keys = {{"job_id", T::kString},
                                                {"job_uid", T::kString},
                                                {"stragglers", T::kArray},
                                                {"replica_micro_batches", T::kArray},
                                                {"state", T::kString},
                                                {"spec_json", T::kString},
                                                {"base_dir", T::kString},
                                                {"world_size", T::kNumber},
                                                {"tp", T::kNumber},
                                                {"dp", T::kNumber},
                                                {"steps", T::kNumber},
                                                {"policy", T::kObject},
                                                {"workers_joined", T::kNumber},
                                                {"workers", T::kArray},
                                                {"windows_published", T::kNumber},
                                                {"steps_completed", T::kNumber},
                                                {"failure_reason", T::kString},
                                                {"warnings", T::kArray},
                                                {"attempt", T::kNumber},
                                                {"restarts", T::kNumber},
                                                {"max_restarts", T::kNumber},
                                                {"last_checkpoint_step", T::kNumber},
                                                {"resume_step", T::kNumber},
                                                {"last_recovery_reason", T::kString},
                                                {"stalled", T::kArray},
                                                {"determinism_violations", T::kNumber},
                                                {"slowest", T::kArray},
                                                {"world", T::kNumber},
                                                {"attempts", T::kArray}};
  return keys;
}

json ParseLine(const Captured& c, const std::string& where) {
  const json j = json::parse(c.output, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << where << ": not one JSON value:\n" << c.output;
  return j;
}

TEST(CliJson, EveryCommandsOutputHasTheDocumentedShape) {
  const ScopedTempDir dir("cli-json");
  Coordinator c(dir.path());
  ASSERT_TRUE(c.ok()) << c.log();
  const std::vector<std::string> at = {"--json", "--coordinator", c.address()};
  const std::string spec = WriteSpec(dir.path(), BuiltInSpec());

  // An empty answer is an empty list, not a missing key.
  const json empty = ParseLine(Cli({"list"}, at), "list (none)");
  ExpectKeys(empty, {{"jobs", T::kArray}}, "list (none)");
  EXPECT_TRUE(empty["jobs"].empty());

  const Captured submitted = Cli({"submit", spec}, at);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const json sub = ParseLine(submitted, "submit");
  ExpectKeys(sub,
             {{"job_id", T::kString},
              {"join_token", T::kString},
              {"already_submitted", T::kBool},
              {"job", T::kObject}},
             "submit");
  ExpectKeys(sub["job"], JobKeys(), "submit.job");
  EXPECT_EQ(sub["job"]["attempt"], 1);
  EXPECT_EQ(sub["job"]["steps"], 40);
  EXPECT_EQ(sub["job"]["steps_completed"], 0);  // a zero value, present
  EXPECT_EQ(sub["already_submitted"], false);
  ExpectNoQuotedIntegers(sub, "submit");
  const std::string job = sub["job_id"];

  const json list = ParseLine(Cli({"list"}, at), "list");
  ExpectKeys(list, {{"jobs", T::kArray}}, "list");
  ASSERT_EQ(list["jobs"].size(), 1u) << list.dump();
  ExpectKeys(list["jobs"][0], JobKeys(), "list.jobs[0]");
  ExpectNoQuotedIntegers(list, "list");

  const json status = ParseLine(Cli({"status", job}, at), "status");
  ExpectKeys(status, JobKeys(), "status");
  EXPECT_EQ(status["steps"], 40);
  EXPECT_EQ(status["last_checkpoint_step"], -1);
  ExpectNoQuotedIntegers(status, "status");

  const json update = ParseLine(Cli({"update", job, "--gas", "2"}, at), "update");
  ExpectKeys(update, {{"policy", T::kObject}, {"first_window", T::kNumber}}, "update");
  ExpectKeys(update["policy"],
             {{"generation", T::kNumber},
              {"kv_reduce", T::kString},
              {"gradient_accumulation_steps", T::kNumber}},
             "update.policy");
  EXPECT_EQ(update["policy"]["gradient_accumulation_steps"], 2);
  ExpectNoQuotedIntegers(update, "update");

  const json latches = ParseLine(Cli({"latches", job}, at), "latches");
  ExpectKeys(latches,
             {{"latches", T::kArray},
              {"policy_changes", T::kArray},
              {"next_start_window", T::kNumber},
              {"events", T::kArray}},
             "latches");
  ExpectNoQuotedIntegers(latches, "latches");

  const json cancel = ParseLine(Cli({"cancel", job}, at), "cancel");
  ExpectKeys(cancel, JobKeys(), "cancel");
  EXPECT_EQ(cancel["state"], "JOB_STATE_CANCELLED") << cancel.dump();
  ExpectNoQuotedIntegers(cancel, "cancel");

  // watch: one object per line, each {job, ...}; the job ended, so it ends at once.
  const Captured watched = Cli({"watch", job}, at);
  EXPECT_EQ(watched.exit_code, 11) << watched.output;
  std::istringstream lines(watched.output);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const json update_line = json::parse(line, nullptr, false);
    ASSERT_FALSE(update_line.is_discarded()) << line;
    ExpectKeys(update_line, {{"job", T::kObject}}, "watch");
    ExpectNoQuotedIntegers(update_line, "watch");
    ++n;
  }
  EXPECT_GE(n, 1) << watched.output;

  // resume: the cancelled job's new attempt, in the same Job shape.
  const json resumed = ParseLine(Cli({"resume", job}, at), "resume");
  ExpectKeys(resumed, JobKeys(), "resume");
  EXPECT_EQ(resumed["state"], "JOB_STATE_RECOVERING") << resumed.dump();
  EXPECT_EQ(resumed["attempt"], 2) << resumed.dump();
  ExpectNoQuotedIntegers(resumed, "resume");

  const json validate = ParseLine(Cli({"--json", "validate", spec}), "validate");
  ExpectKeys(validate,
             {{"valid", T::kBool},
              {"world_size", T::kNumber},
              {"tp", T::kNumber},
              {"dp", T::kNumber},
              {"steps", T::kNumber},
              {"parameters", T::kNumber},
              {"files_checked", T::kBool},
              {"warnings", T::kArray}},
             "validate");

  const json none =
      ParseLine(Cli({"--json", "checkpoints", job, "--dir", dir / "ckpt"}), "checkpoints");
  ExpectKeys(none,
             {{"job_id", T::kString},
              {"job_uid", T::kString},
              {"dir", T::kString},
              {"checkpoints", T::kArray}},
             "checkpoints");
  EXPECT_TRUE(none["checkpoints"].empty());
}

}  // namespace
}  // namespace latchkey::testing
