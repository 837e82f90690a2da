// A run folder used twice, and a job id that two coordinators both have, with real processes:
// `latchkey up` Ctrl-C'd and `up` again in the same folder keeps the first job's records its own
// (`logs job-000001` prints them unchanged), the summary counts the steps the progress line
// does, and its values stay in one column; `logs`, `checkpoints` and `status` mean the job at an
// explicit --coordinator, refuse to guess between two runs of one id, and say where a job ran
// once its `up` has ended; a run registry of the first format is still read.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_support.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;
using std::chrono::seconds;

// The built-in job with `steps` steps (its schedule too).
json ShortSpec(int steps) {
  json spec = BuiltInSpec();
  spec["latchkey"]["steps"] = steps;
  spec["scheduler"]["params"]["total_num_steps"] = steps;
  return spec;
}

std::vector<json> Jsonl(const std::string& path) {
  std::vector<json> rows;
  std::istringstream in(ReadText(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(json::parse(line, nullptr, false));
  }
  return rows;
}

// The lines of up's summary table (after "summary (rank 0)").
std::vector<std::string> SummaryLines(const std::string& out) {
  std::vector<std::string> lines;
  const size_t at = out.find("summary (rank 0)\n");
  if (at == std::string::npos) return lines;
  std::istringstream in(out.substr(at));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line) && line.rfind("  ", 0) == 0) lines.push_back(line);
  return lines;
}

// Where a summary line's value starts: past the label and the spaces after it (the first line's
// label, "steps", is short: two spaces or more).
size_t ValueColumn(const std::string& line) {
  const size_t gap = line.find("  ", 2);
  return gap == std::string::npos ? std::string::npos : line.find_first_not_of(' ', gap);
}

// Whether `line`'s value starts at `column`: a space before it, none there.
bool ValueStartsAt(const std::string& line, size_t column) {
  return column < line.size() && line[column - 1] == ' ' && line[column] != ' ';
}

int64_t Count(const std::string& text, const std::regex& re) {
  std::smatch m;
  return std::regex_search(text, m, re) ? std::stoll(m[1]) : -1;
}

// The acceptance: `up` Ctrl-C'd, `up` again in the same folder, and the first job's records are
// its own, whole, while the top level shows the newest job's.
TEST(SecondRun, UpAgainInTheSameFolderKeepsTheFirstJobsRecords) {
  const ScopedTempDir dir("second-run");
  const std::string first_spec = WriteSpec(dir.path(), ShortSpec(200), "long.json");
  json short_spec = ShortSpec(4);
  short_spec["latchkey"]["kv_reduce"] = "per_micro_batch";  // its label is the longest
  const std::string second_spec = WriteSpec(dir.path(), short_spec, "short.json");
  const std::string run = dir / "run";

  std::string first_out;
  {
    UpRun up({"--spec", first_spec, "--run-dir", run}, dir / "up-1.log");
    ASSERT_TRUE(up.started());
    ASSERT_EQ(up.Grab("job          (\\S+)"), "job-000001") << up.Output();
    ASSERT_TRUE(WaitForStep(run + "/steps-0.jsonl", 3)) << up.Output();
    ASSERT_TRUE(up.Interrupt());
    ASSERT_EQ(up.Wait(seconds(60)), 11) << up.Output();
    first_out = up.Output();
  }
  // One count of the interrupted job's steps: the last progress line's and the summary's.
  const int64_t bar = Count(first_out, std::regex("step ([0-9]+)/200[^\n]* cancelled\n"));
  const int64_t summary = Count(first_out, std::regex("\n  steps +([0-9]+)"));
  EXPECT_GE(bar, 1) << first_out;
  EXPECT_EQ(summary, bar) << first_out;

  const Captured first_logs = Cli({"logs", "job-000001"});
  ASSERT_EQ(first_logs.exit_code, 0) << first_logs.output;
  ASSERT_TRUE(Has(first_logs.output, "[rank 0] rank 0 step 1/200")) << first_logs.output;
  ASSERT_TRUE(Has(first_logs.output, "[rank 1] rank 1 step 1/200")) << first_logs.output;
  const Captured first_rank1 = Cli({"logs", "job-000001", "--rank", "1"});
  ASSERT_EQ(first_rank1.exit_code, 0) << first_rank1.output;
  const std::string first_jsonl = ReadText(run + "/steps-0.jsonl");
  ASSERT_FALSE(first_jsonl.empty());

  // Again in the same folder: the database numbers the new job job-000002. To its end.
  UpRun again({"--spec", second_spec, "--run-dir", run}, dir / "up-2.log");
  ASSERT_TRUE(again.started());
  ASSERT_EQ(again.Wait(seconds(300)), 0) << again.Output();
  const std::string second_out = again.Output();
  EXPECT_TRUE(Has(second_out, "job          job-000002")) << second_out;

  // The first job's records, whole and unchanged; nothing of the second job's among them.
  const Captured logs = Cli({"logs", "job-000001"});
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_EQ(logs.output, first_logs.output);
  EXPECT_FALSE(Has(logs.output, "step 4/4")) << logs.output;
  EXPECT_EQ(Cli({"logs", "job-000001", "--rank", "1"}).output, first_rank1.output);
  EXPECT_EQ(Cli({"logs", "job-000001", "--run-dir", run}).output, first_logs.output);
  EXPECT_EQ(ReadText(run + "/jobs/job-000001/steps-0.jsonl"), first_jsonl);
  // The second job's are its own.
  const Captured second_logs = Cli({"logs", "job-000002"});
  EXPECT_EQ(second_logs.exit_code, 0) << second_logs.output;
  EXPECT_TRUE(Has(second_logs.output, "[rank 0] rank 0 step 4/4")) << second_logs.output;
  EXPECT_TRUE(Has(second_logs.output, "[rank 1] rank 1 step 4/4")) << second_logs.output;
  EXPECT_FALSE(Has(second_logs.output, "/200")) << second_logs.output;
  // The top level is the newest job's: its 4 steps, its log.
  const std::vector<json> rows = Jsonl(run + "/steps-0.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(rows[static_cast<size_t>(s)]["step"], s);
  EXPECT_TRUE(Has(ReadText(run + "/worker-1.log"), "rank 1 step 4/4"));
  EXPECT_EQ(Jsonl(run + "/steps-1.jsonl").size(), 4u);
  // A job the folder never ran is not found, naming where it looked.
  const Captured none = Cli({"logs", "job-000009", "--run-dir", run});
  EXPECT_EQ(none.exit_code, 4) << none.output;
  EXPECT_TRUE(Has(none.output, run + "/jobs/job-000009")) << none.output;

  // The second summary: 4 steps, and every value in one column, the longest label's included.
  EXPECT_EQ(Count(second_out, std::regex("\n  steps +([0-9]+)")), 4) << second_out;
  const std::vector<std::string> lines = SummaryLines(second_out);
  ASSERT_GE(lines.size(), 6u) << second_out;
  bool saw_kv = false;
  for (const std::string& line : lines) {
    saw_kv = saw_kv || Has(line, "K/V all-reduces/step, per_micro_batch");
    EXPECT_TRUE(ValueStartsAt(line, ValueColumn(lines.front()))) << line << "\n" << second_out;
  }
  EXPECT_TRUE(saw_kv) << second_out;
}

// Two coordinators with a job-000001 each (one by `up`, one started by hand), then a third by a
// bare `up` in a run folder of the older layout; a run registry of the first format to begin.
TEST(SecondRun, AJobIdMeansTheJobAtItsCoordinator) {
  const ScopedTempDir dir("second-run-ids");
  // A registry an older latchkey wrote (keyed by job id), with an entry it cannot use.
  const std::string legacy = dir / "run-c";
  std::filesystem::create_directories(legacy);
  std::ofstream(legacy + "/worker-0.log") << "old rank 0 line\n";
  std::ofstream(legacy + "/worker-1.log") << "old rank 1 line\n";
  std::ofstream(legacy + "/steps-0.jsonl") << "{\"step\":0,\"loss\":1.0}\n";
  std::filesystem::create_directories(StateHome() + "/latchkey");
  std::ofstream(StateHome() + "/latchkey/runs.json") << json{
      {"job-000042",
       {{"run_dir", legacy}, {"checkpoint_dir", ""}, {"world", 2}, {"recorded_unix_seconds", 1}}},
      {"job-000043", {{"run_dir", 5}}}}.dump();
  const Captured old = Cli({"logs", "job-000042"});
  EXPECT_EQ(old.exit_code, 0) << old.output;
  EXPECT_TRUE(Has(old.output, "[rank 1] old rank 1 line")) << old.output;

  // A: `up`, checkpointing after steps 1 and 3 into ckpt-a.
  json a = ShortSpec(4);
  a["latchkey"]["checkpoint"] = {{"dir", "ckpt-a"}, {"every_steps", 2}};
  const std::string run_a = dir / "run-a";
  std::string address_a;
  {
    UpRun up({"--spec", WriteSpec(dir.path(), a, "a.json"), "--run-dir", run_a}, dir / "up-a.log");
    address_a = up.Grab("coordinator  (\\S+)");
    ASSERT_EQ(up.Wait(seconds(300)), 0) << up.Output();
    ASSERT_TRUE(Has(up.Output(), "job          job-000001")) << up.Output();
  }
  ASSERT_FALSE(address_a.empty());
  // The registry is of the new format now, the first format's entry kept.
  const json registry = json::parse(ReadText(StateHome() + "/latchkey/runs.json"), nullptr, false);
  ASSERT_TRUE(registry.is_object()) << registry;
  EXPECT_EQ(registry.value("version", 0), 2) << registry;
  bool kept = false;
  if (registry.contains("runs") && registry["runs"].is_array()) {
    for (const json& r : registry["runs"]) kept = kept || r.value("job_id", "") == "job-000042";
  }
  EXPECT_TRUE(kept) << registry;

  // status of A's job, its `up` ended: where it ran and where its records are (exit 5). Asked
  // before B starts, which could be given A's old port.
  const Captured status = Cli({"status", "job-000001"}, {"--coordinator", address_a});
  EXPECT_EQ(status.exit_code, 5) << status.output;
  EXPECT_TRUE(Has(status.output, "nothing is listening at " + address_a)) << status.output;
  EXPECT_TRUE(Has(status.output, "ran under `latchkey up` in " + run_a)) << status.output;
  EXPECT_TRUE(Has(status.output, "`latchkey logs job-000001 --run-dir " + run_a + "`"))
      << status.output;
  EXPECT_TRUE(Has(status.output, run_a + "/coordinator.db")) << status.output;

  // B: a coordinator started by hand, its own job-000001 checkpointing into ckpt-b.
  Coordinator b(dir.path());
  ASSERT_TRUE(b.ok()) << b.log();
  json bspec = ShortSpec(4);
  bspec["latchkey"]["checkpoint"] = {{"dir", "ckpt-b"}, {"every_steps", 2}};
  const Captured submitted =
      Cli({"submit", WriteSpec(dir.path(), bspec, "b.json")}, {"--coordinator", b.address()});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  ASSERT_TRUE(Has(submitted.output, "job-000001")) << submitted.output;

  // An explicit --coordinator means its job: B's spec's folder, not A's recorded run.
  const Captured ck_b =
      Cli({"--json", "checkpoints", "job-000001"}, {"--coordinator", b.address()});
  ASSERT_EQ(ck_b.exit_code, 0) << ck_b.output;
  const json jb = json::parse(ck_b.output, nullptr, false);
  ASSERT_TRUE(jb.is_object()) << ck_b.output;
  EXPECT_EQ(jb["dir"], dir / "ckpt-b") << ck_b.output;
  EXPECT_TRUE(jb["checkpoints"].empty()) << ck_b.output;
  const Captured logs_b = Cli({"logs", "job-000001"}, {"--coordinator", b.address()});
  EXPECT_EQ(logs_b.exit_code, 4) << logs_b.output;
  EXPECT_TRUE(Has(logs_b.output, "job-000001 at coordinator " + b.address())) << logs_b.output;
  EXPECT_FALSE(Has(logs_b.output, "step 4/4")) << logs_b.output;
  // Without one, the one recorded run of the id: A's.
  const Captured ck_a = Cli({"--json", "checkpoints", "job-000001"});
  ASSERT_EQ(ck_a.exit_code, 0) << ck_a.output;
  const json ja = json::parse(ck_a.output, nullptr, false);
  ASSERT_TRUE(ja.is_object()) << ck_a.output;
  EXPECT_EQ(ja["dir"], dir / "ckpt-a");
  std::vector<int64_t> steps;
  for (const json& c : ja["checkpoints"]) steps.push_back(c["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3})) << ck_a.output;

  // C: a bare `up` in the older layout's folder, another job-000001, Ctrl-C'd once it started.
  {
    UpRun up({"--run-dir", legacy}, dir / "up-c.log");
    const std::string spec_line = up.Grab("(spec         [^\n]*)\n");
    EXPECT_TRUE(Has(spec_line, "the demo's layers with a 256-token vocabulary")) << spec_line;
    EXPECT_FALSE(Has(spec_line, "demo model")) << spec_line;
    ASSERT_EQ(up.Grab("job          (\\S+)"), "job-000001") << up.Output();
    ASSERT_FALSE(up.Grab("(worker 1     pid)").empty()) << up.Output();
    ASSERT_TRUE(up.Interrupt());
    EXPECT_EQ(up.Wait(seconds(60)), 11) << up.Output();
  }
  // The older layout's records went to the job the registry named for the folder.
  const Captured moved = Cli({"logs", "job-000042"});
  EXPECT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_TRUE(Has(moved.output, "[rank 0] old rank 0 line")) << moved.output;
  EXPECT_EQ(ReadText(legacy + "/jobs/job-000042/worker-1.log"), "old rank 1 line\n");

  // Two recorded runs of job-000001 and nothing to say which: refused, naming both.
  const Captured either = Cli({"logs", "job-000001"});
  EXPECT_EQ(either.exit_code, 3) << either.output;
  EXPECT_TRUE(Has(either.output, run_a)) << either.output;
  EXPECT_TRUE(Has(either.output, legacy)) << either.output;
  EXPECT_TRUE(Has(either.output, address_a)) << either.output;
  EXPECT_TRUE(Has(either.output, "--coordinator")) << either.output;
  EXPECT_EQ(Cli({"checkpoints", "job-000001"}).exit_code, 3);
  // Either named: that run's records.
  const Captured at_a = Cli({"logs", "job-000001"}, {"--coordinator", address_a});
  EXPECT_EQ(at_a.exit_code, 0) << at_a.output;
  EXPECT_TRUE(Has(at_a.output, "[rank 0] rank 0 step 4/4")) << at_a.output;
  const Captured in_c = Cli({"logs", "job-000001", "--run-dir", legacy});
  EXPECT_EQ(in_c.exit_code, 0) << in_c.output;
  EXPECT_FALSE(Has(in_c.output, "step 4/4")) << in_c.output;
  EXPECT_FALSE(Has(in_c.output, "old rank")) << in_c.output;
  EXPECT_TRUE(Has(in_c.output, "[rank 0] ")) << in_c.output;
}

}  // namespace
}  // namespace latchkey::testing
