// The first minutes of a new user, from an empty folder, with real processes: `latchkey
// validate`, `latchkey up` stopped by Ctrl-C half-way, `latchkey up` again, `status` (text and
// --json, parsed) while it runs, then `logs` and `checkpoints` of the jobs, and at the end
// nothing of either run left running or in /dev/shm. Then the demo's spec run twice under two
// run folders, sharing its checkpoint folder, with a worker killed in the second.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/sha256.h"
#include "common/subprocess.h"
#include "tests/cli/cli_support.h"
#include "tests/support/proc_scan.h"
#include "tests/support/temp_dir.h"
#include "worker/data/megatron_test_util.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The pids `up` printed for its coordinator and workers.
std::set<int> PrintedPids(const std::string& text) {
  std::set<int> pids;
  const std::regex pid_re("(?:db [^\n]*, pid|worker [0-9]+ +pid) ([0-9]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), pid_re), end; it != end; ++it) {
    pids.insert(std::stoi((*it)[1]));
  }
  return pids;
}

// `latchkey --json checkpoints ARGS`, parsed: its checkpoints array, or null when it fails or
// prints no JSON object (each recorded as a failure naming its output).
json CheckpointsOf(const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {"--json", "checkpoints"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const Captured ck = Cli(cmd);
  EXPECT_EQ(ck.exit_code, 0) << ck.output;
  const json cj = json::parse(ck.output, nullptr, false);
  EXPECT_TRUE(cj.is_object()) << ck.output;
  return ck.exit_code == 0 && cj.is_object() ? cj.value("checkpoints", json()) : json();
}

// `latchkey up ARGS` in a process group of its own (as a shell's foreground job), its output in
// `log`.
struct Up {
  int pid = -1;
  std::string log;
  Up(const std::vector<std::string>& args, const std::string& log_path) : log(log_path) {
    SpawnOptions o;
    o.args = {LATCHKEY_CLI_BIN, "up"};
    o.args.insert(o.args.end(), args.begin(), args.end());
    o.log_path = log_path;
    o.own_process_group = true;
    auto p = Spawn(o);
    pid = p.ok() ? *p : -1;
  }
  std::string Output() const { return ReadText(log); }
  std::string Grab(const std::string& pattern, seconds deadline = seconds(120)) const {
    const std::regex re(pattern);
    std::smatch m;
    const auto until = Clock::now() + deadline;
    while (Clock::now() < until) {
      const std::string text = Output();
      if (std::regex_search(text, m, re)) return m[1].str();
      std::this_thread::sleep_for(milliseconds(50));
    }
    return "";
  }
};

TEST(Walkthrough, FromAnEmptyFolder) {
  const ScopedTempDir dir("cli-walkthrough");
  // The built-in job, 30 steps, a checkpoint every 4 steps in ckpt/ (relative: the spec's folder).
  json spec = BuiltInSpec();
  spec["latchkey"]["steps"] = 30;
  spec["scheduler"]["params"]["total_num_steps"] = 30;
  spec["latchkey"]["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 4}, {"keep", 10}};
  const std::string path = WriteSpec(dir.path(), spec, "job.json");

  const Captured validated = Cli({"validate", path});
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_TRUE(Has(validated.output, "checkpoints:  " + dir.path() + "/ckpt")) << validated.output;

  // First run: Ctrl-C (SIGINT to the group) once a checkpoint was committed and more steps ran.
  const std::string run = dir / "run";
  std::string first_job;
  {
    Up up({"--spec", path, "--run-dir", run}, dir / "up-1.log");
    ASSERT_GT(up.pid, 0);
    first_job = up.Grab("job          (\\S+)");
    ASSERT_FALSE(first_job.empty()) << up.Output();
    ASSERT_TRUE(WaitForStep(run + "/steps-0.jsonl", 9)) << up.Output();
    ASSERT_EQ(kill(-up.pid, SIGINT), 0);
    EXPECT_EQ(WaitProcess(up.pid, seconds(20)), 11) << up.Output();
    EXPECT_TRUE(Has(up.Output(), "cancelling job " + first_job)) << up.Output();
  }
  EXPECT_EQ(ReadText(run + "/spec.json").empty(), false);  // the spec kept with the run

  // Second run in the same folder: to the end.
  Up again({"--spec", path, "--run-dir", run}, dir / "up-2.log");
  ASSERT_GT(again.pid, 0);
  const std::string address = again.Grab("coordinator  (\\S+)");
  const std::string job = again.Grab("job          (\\S+)");
  ASSERT_FALSE(job.empty()) << again.Output();
  EXPECT_NE(job, first_job);
  // A second `up` in a folder a live one holds is refused.
  const Captured third = Cli({"up", "--spec", path, "--run-dir", run}, {}, seconds(30));
  EXPECT_EQ(third.exit_code, 5) << third.output;
  EXPECT_TRUE(Has(third.output, "another latchkey up is running in it")) << third.output;
  ASSERT_TRUE(WaitForStep(run + "/steps-0.jsonl", 2)) << again.Output();
  // status through the credentials file `up` wrote (no --token given).
  const Captured status = Cli({"status", job}, {"--coordinator", address});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_TRUE(Has(status.output, "job:          " + job)) << status.output;
  const Captured js = Cli({"status", job}, {"--json", "--coordinator", address});
  ASSERT_EQ(js.exit_code, 0) << js.output;
  const json s = json::parse(js.output, nullptr, false);
  ASSERT_TRUE(s.is_object()) << js.output;
  EXPECT_EQ(s["job_id"], job);
  EXPECT_EQ(s["steps"], 30);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_TRUE(s["steps_completed"].is_number()) << js.output;
  EXPECT_EQ(WaitProcess(again.pid, seconds(300)), 0) << again.Output();

  // The ranks' logs hold the per-step lines of every rank.
  const Captured logs = Cli({"logs", job});
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_TRUE(Has(logs.output, "[rank 0] rank 0 step 30/30")) << logs.output;
  EXPECT_TRUE(Has(logs.output, "[rank 1] rank 1 step 30/30")) << logs.output;
  EXPECT_TRUE(Has(logs.output, "logs to " + run + "/jobs/" + job + "/worker-1.log")) << logs.output;
  const Captured one = Cli({"logs", job, "--rank", "1"});
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_FALSE(Has(one.output, "rank 0 step")) << one.output;
  // -f on a run that ended prints what there is and returns.
  EXPECT_EQ(Cli({"logs", job, "-f"}, {}, seconds(20)).exit_code, 0);

  // The committed checkpoints of each job: after steps 3, 7, ... (every 4).
  const json checkpoints = CheckpointsOf({job});
  ASSERT_TRUE(checkpoints.is_array());
  std::vector<int64_t> steps;
  for (const json& c : checkpoints) {
    steps.push_back(c["step"].get<int64_t>());
    EXPECT_GT(c["bytes"].get<int64_t>(), 0);
    EXPECT_EQ(c["world_size"], 2);
    EXPECT_EQ(c["tp"], 2);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 7, 11, 15, 19, 23, 27})) << checkpoints.dump();
  const Captured text = Cli({"checkpoints", job});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(Has(text.output, "world 2 (tp 2 x dp 1) zero 0")) << text.output;
  // The first job's records and checkpoints, in the same folders, are still its own: `logs`
  // prints its steps (up to the Ctrl-C, none of the second job's), and the second job's commits
  // of the same steps did not replace its checkpoints.
  const Captured first_logs = Cli({"logs", first_job, "--rank", "0"});
  EXPECT_EQ(first_logs.exit_code, 0) << first_logs.output;
  EXPECT_TRUE(Has(first_logs.output, "rank 0 step 9/30")) << first_logs.output;
  EXPECT_FALSE(Has(first_logs.output, "rank 0 step 30/30")) << first_logs.output;
  const json first_checkpoints = CheckpointsOf({first_job});
  ASSERT_TRUE(first_checkpoints.is_array());
  std::vector<int64_t> first_steps;
  for (const json& c : first_checkpoints) first_steps.push_back(c["step"].get<int64_t>());
  ASSERT_GE(first_steps.size(), 2u) << first_checkpoints.dump();
  EXPECT_EQ(first_steps[0], 3) << first_checkpoints.dump();
  EXPECT_EQ(first_steps[1], 7) << first_checkpoints.dump();
  for (const json& c : first_checkpoints) {
    EXPECT_EQ(Cli({"checkpoint", "inspect", c["dir"].get<std::string>()}).exit_code, 0) << c.dump();
  }

  // Nothing left: no process naming the run folder, no new /dev/shm segment, and the
  // credentials file without the entry of the coordinators `up` stopped.
  const auto until = Clock::now() + seconds(10);
  while (!LiveProcesses(run).empty() && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(LiveProcesses(run).empty());
  std::set<int> pids = PrintedPids(ReadText(dir / "up-1.log"));
  for (int p : PrintedPids(again.Output())) pids.insert(p);
  EXPECT_GE(pids.size(), 6u);  // two coordinators and four workers
  for (int p : pids) {
    EXPECT_FALSE(ProcessAlive(p)) << "pid " << p
                                  << " of a run still alive: " << ReadProcFile(p, "stat");
  }
  for (const auto& [segment, owners] : ShmSegmentPids()) {
    for (int p : owners)
      EXPECT_EQ(pids.count(p), 0u) << segment << " names pid " << p << " of a run";
  }
  const json creds = json::parse(ReadText(ConfigHome() + "/latchkey/credentials"), nullptr, false);
  EXPECT_TRUE(!creds.is_object() || !creds.contains(address)) << creds.dump();
}

// The manifests of the committed checkpoints under `root`: folder name -> SHA-256 of its
// manifest.json (what a later job must leave untouched).
std::map<std::string, std::string> CommittedManifests(const std::string& root) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    const std::string text = ReadText(e.path() / "manifest.json");
    if (!text.empty()) out[name] = Sha256Hex(text);
  }
  return out;
}

// The last record of each step of a per-step JSONL (a resumed rank appends), and the order of
// the steps as written.
struct StepRecords {
  std::map<int64_t, json> last;
  std::vector<int64_t> order;
};
StepRecords ReadSteps(const std::string& jsonl) {
  StepRecords r;
  std::istringstream in(ReadText(jsonl));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step")) continue;
    r.last[j["step"].get<int64_t>()] = j;
    r.order.push_back(j["step"].get<int64_t>());
  }
  return r;
}

// Every tensor piece's SHA-256 of a checkpoint, by "file/key": equal when two checkpoints hold
// the same numbers, whatever job, attempt or time wrote them.
std::map<std::string, std::string> PieceDigests(const std::string& step_dir) {
  std::map<std::string, std::string> out;
  const json m = json::parse(ReadText(step_dir + "/manifest.json"), nullptr, false);
  if (!m.is_object()) return out;
  for (const json& t : m.value("tensors", json::array())) {
    for (const json& p : t.value("pieces", json::array())) {
      out[p.value("key", std::string()) + "@" + p.value("file", std::string())] =
          p.value("sha256", std::string());
    }
  }
  return out;
}

// A Megatron dataset of `docs` documents of random ids below `vocab` (fixed seed) at `prefix`.
void WriteCorpus(const std::string& prefix, int docs, int tokens_per_doc, int vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> id(1, vocab - 1);
  std::vector<std::vector<int64_t>> seqs(docs);
  for (auto& s : seqs) {
    for (int t = 0; t < tokens_per_doc; ++t) s.push_back(id(rng));
  }
  const MegatronFiles f = MakeMegatronFiles(/*uint16*/ 8, seqs);
  std::filesystem::create_directories(std::filesystem::path(prefix).parent_path());
  std::ofstream(prefix + ".idx", std::ios::binary) << f.idx;
  std::ofstream(prefix + ".bin", std::ios::binary) << f.bin;
}

// scripts/demo.sh's spec (examples/demo.json, unchanged) run as a user runs it twice: once under
// runs/demo, then again under another run folder, where a worker is killed (kill -9) mid-run.
// Both jobs are job-000001 (each run folder has its coordinator's database) and checkpoint into
// the one folder the spec names (runs/demo/checkpoints). The second job recovers from its own
// checkpoint, ends bitwise equal to the first (an uninterrupted run of the same spec), and the
// first job's checkpoints are all still there, untouched.
TEST(Walkthrough, DemoSpecTwiceUnderTwoRunFolders) {
  const ScopedTempDir dir("cli-demo-twice");
  // The repository's layout: examples/demo.json names ../runs/demo/data/corpus and
  // ../runs/demo/checkpoints. The dataset is a stand-in for the BPE corpus demo.sh prepares
  // (same vocabulary, uint16), so the test needs no tokenizer.
  std::filesystem::create_directories(dir / "examples");
  const std::string spec_text = ReadText(std::string(LATCHKEY_SOURCE_DIR) + "/examples/demo.json");
  ASSERT_FALSE(spec_text.empty());
  const json spec = json::parse(spec_text);
  const std::string spec_path = dir / "examples/demo.json";
  std::ofstream(spec_path) << spec_text;
  WriteCorpus(dir / "runs/demo/data/corpus", 40, 300, spec["model"]["vocab_size"].get<int>());
  const int steps = spec["latchkey"]["steps"].get<int>();
  const std::string ckpt = dir / "runs/demo/checkpoints";

  // First run, to the end.
  const std::string run1 = dir / "runs/demo";
  {
    UpRun up({"--spec", spec_path, "--run-dir", run1}, dir / "up-1.log");
    ASSERT_TRUE(up.started());
    ASSERT_EQ(up.Wait(seconds(400)), 0) << up.Output();
  }
  const std::map<std::string, std::string> first = CommittedManifests(ckpt);
  ASSERT_EQ(first.size(), 2u) << "keep 2";  // after steps 29 and 39
  ASSERT_TRUE(first.count("step-00000029") && first.count("step-00000039"));
  const StepRecords ref = ReadSteps(run1 + "/steps-0.jsonl");
  ASSERT_EQ(static_cast<int>(ref.last.size()), steps);

  // Second run under another run folder; rank 1 killed (-9) after step 13, i.e. after the
  // checkpoint of step 9 committed.
  const std::string run2 = dir / "runs/second";
  UpRun up({"--spec", spec_path, "--run-dir", run2}, dir / "up-2.log");
  ASSERT_TRUE(up.started());
  const std::string worker1 = up.Grab("worker 1 +pid ([0-9]+)");
  ASSERT_FALSE(worker1.empty()) << up.Output();
  // It says the folder holds another job's checkpoints, which it keeps.
  EXPECT_TRUE(Has(up.Output(), "already holds committed checkpoints of other jobs: job-000001"))
      << up.Output();
  ASSERT_TRUE(WaitForStep(run2 + "/steps-0.jsonl", 13)) << up.Output();
  ASSERT_EQ(kill(std::stoi(worker1), SIGKILL), 0);
  ASSERT_EQ(up.Wait(seconds(400)), 0) << up.Output();
  EXPECT_TRUE(std::regex_search(up.Output(), std::regex("restarts +1 \\(attempt 2\\)")))
      << up.Output();

  // It resumed from its own checkpoint after step 9: the steps after 13 start again at 10.
  const StepRecords got = ReadSteps(run2 + "/steps-0.jsonl");
  ASSERT_EQ(static_cast<int>(got.last.size()), steps);
  auto again = std::adjacent_find(got.order.begin(), got.order.end(),
                                  [](int64_t a, int64_t b) { return b <= a; });
  ASSERT_NE(again, got.order.end()) << "no step was run again after the kill";
  EXPECT_GE(*again, 13);
  EXPECT_EQ(*(again + 1), 10);
  // Bitwise equal to the uninterrupted run: every step's loss and gradient norm, and the
  // final weights.
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(got.last.at(s)["loss"], ref.last.at(s)["loss"]) << "step " << s;
    EXPECT_EQ(got.last.at(s)["grad_norm"], ref.last.at(s)["grad_norm"]) << "step " << s;
  }
  const std::string w1 = ReadText(run1 + "/final/model.safetensors");
  ASSERT_FALSE(w1.empty());
  EXPECT_TRUE(w1 == ReadText(run2 + "/final/model.safetensors"));

  // The first job's checkpoints: all there, the same bytes, still verifying.
  const std::map<std::string, std::string> after = CommittedManifests(ckpt);
  for (const auto& [name, sha] : first) {
    ASSERT_TRUE(after.count(name)) << name << " of the first job is gone";
    EXPECT_EQ(after.at(name), sha) << name << " of the first job was rewritten";
    EXPECT_EQ(Cli({"checkpoint", "inspect", ckpt + "/" + name}).exit_code, 0) << name;
  }
  // The second job's own: the last two (keep 2), and the one its second attempt resumed from
  // (kept while that attempt runs); those of the steps the first job also saved hold the same
  // numbers as the first job's.
  const json checkpoints = CheckpointsOf({"job-000001", "--run-dir", run2});
  ASSERT_TRUE(checkpoints.is_array());
  std::vector<int64_t> own;
  for (const json& c : checkpoints) {
    own.push_back(c["step"].get<int64_t>());
    const std::string d = c["dir"].get<std::string>();
    EXPECT_EQ(first.count(std::filesystem::path(d).filename().string()), 0u) << d;
    char twin[32];
    std::snprintf(twin, sizeof(twin), "step-%08lld", static_cast<long long>(own.back()));
    if (first.count(twin) == 0) continue;
    EXPECT_EQ(PieceDigests(d), PieceDigests(ckpt + "/" + twin)) << d << " vs " << twin;
    EXPECT_FALSE(PieceDigests(d).empty()) << d;
  }
  EXPECT_EQ(own, (std::vector<int64_t>{9, 29, 39})) << checkpoints.dump();
  EXPECT_EQ(CommittedManifests(ckpt).size(), 5u);
}

}  // namespace
}  // namespace latchkey::testing
