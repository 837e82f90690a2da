// Two jobs checkpointing into one folder (docs/fault-tolerance.md "Whose checkpoint is it"), with
// real processes: two `latchkey up` runs, each with its own coordinator and database, so both
// jobs are job-000001, save the same steps into one latchkey.checkpoint.dir while both run. A
// worker of each is killed (-9) mid-run; each job resumes from its own newest checkpoint (the
// coordinator's resume step, asserted) and ends as an uninterrupted run of its spec does (every
// step's loss and the final weights, bit for bit; the two specs differ in their seed, so loading
// the other job's checkpoint of a step would show). At the end the folder holds the newest
// `keep` checkpoints of each job and the one it resumed from, each verifying and carrying its
// job's uid, and nothing else;
// the second `up` warned of the first job's checkpoints at its start; `latchkey checkpoints`
// lists each job's own, from the run registry and from the coordinator.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kSteps = 16;
constexpr int kEvery = 2;  // committed after steps 1, 3, ..., 15
constexpr int kKeep = 3;   // each job ends with 11, 13 and 15 (and the one it resumed from)

nlohmann::json Spec(int seed, const std::string& checkpoint_dir) {
  SpecParams p;
  p.tp = 1;
  p.world_size = 1;
  p.steps = kSteps;
  p.seed = seed;
  p.lr = 3e-3;
  p.data = SyntheticData(seed);
  p.extra_latchkey = {
      {"checkpoint", {{"dir", checkpoint_dir}, {"every_steps", kEvery}, {"keep", kKeep}}},
      {"rejoin_timeout_seconds", 30}};
  return SpecObject(p);
}

std::map<int64_t, double> LossByStep(const std::string& jsonl) {
  std::map<int64_t, double> out;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step")) {
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  return out;
}

std::string Hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `latchkey ARGS` with XDG_STATE_HOME (the run registry) set to `state`.
Captured Cli(const std::string& state, std::vector<std::string> args) {
  args.insert(args.begin(), {"env", "XDG_STATE_HOME=" + state, LATCHKEY_CLI_BIN});
  return RunAndCapture(args, seconds(60));
}

// One `latchkey up` of `spec` in <dir>/run, its run registry in <dir>/state; stopped if still
// running when the test ends (a stopped worker continued first).
class Up {
 public:
  Up(const std::string& dir, const nlohmann::json& spec, std::vector<std::string> env = {})
      : dir_(dir) {
    std::ofstream(dir + "/spec.json") << spec.dump(2);
    env.push_back("XDG_STATE_HOME=" + state());
    pid_ = StartProcess({LATCHKEY_CLI_BIN, "up", "--spec", dir + "/spec.json", "--run-dir", run()},
                        env, log_path());
  }
  ~Up() {
    if (stopped_ > 0) kill(stopped_, SIGCONT);
    if (code_ == kRunning) {
      kill(pid_, SIGTERM);
      WaitProcess(pid_, seconds(60));
    }
  }
  static constexpr int kRunning = -1000;
  std::string run() const { return dir_ + "/run"; }
  std::string state() const { return dir_ + "/state"; }
  std::string log_path() const { return dir_ + "/up.log"; }
  std::string log() const { return ReadText(log_path()); }
  std::string jsonl() const { return run() + "/steps-0.jsonl"; }
  int Wait() {
    if (code_ == kRunning) code_ = WaitProcess(pid_, seconds(400));
    return code_;
  }
  std::string Grab(const std::string& pattern) const {
    const std::regex re(pattern);
    std::smatch m;
    const std::string text = WaitForFile(
        log_path(), [&](const std::string& t) { return std::regex_search(t, m, re); },
        seconds(180));
    return std::regex_search(text, m, re) ? m[1].str() : std::string();
  }
  int WorkerPid() const {
    const std::string pid = Grab("worker 0 +pid ([0-9]+)  metrics [^\n]*\\(log ");
    return pid.empty() ? -1 : std::stoi(pid);
  }
  bool WaitForStep(int64_t step) const {
    const auto until = Clock::now() + seconds(240);
    while (Clock::now() < until) {
      const auto losses = LossByStep(jsonl());
      if (!losses.empty() && losses.rbegin()->first >= step) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }
  // `latchkey --json ARGS` against this run's coordinator (its credentials file holds the token).
  nlohmann::json Json(std::vector<std::string> args) const {
    args.insert(args.begin(), {"--json", "--coordinator", Grab("coordinator  (\\S+)")});
    const Captured c = Cli(state(), args);
    return nlohmann::json::parse(c.output.substr(0, c.output.find('\n')), nullptr, false);
  }
  // Stops the worker, reads the job's newest committed checkpoint while nothing can commit
  // another, then kills the worker (-9). Returns that step (-2 when it could not be read).
  int64_t KillWorker(int pid, const std::string& job) {
    if (kill(pid, SIGSTOP) != 0) return -2;
    stopped_ = pid;
    std::this_thread::sleep_for(milliseconds(500));  // a report already sent lands
    const nlohmann::json st = Json({"status", job});
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    stopped_ = -1;
    return st.is_object() ? st.value("last_checkpoint_step", int64_t{-2}) : -2;
  }

 private:
  std::string dir_;
  int pid_ = -1;
  int code_ = kRunning;
  int stopped_ = -1;
};

// What the job's database says once up is done: a coordinator on a copy of it answers
// `--json status` and `checkpoints` (with `--dir`, so the job's uid comes from the coordinator).
struct Afterwards {
  nlohmann::json status;
  nlohmann::json checkpoints;
};
Afterwards ReadBack(const std::string& run, const std::string& job, const std::string& shared) {
  Afterwards out;
  const ScopedTempDir scratch("shared-ckpt-readback");
  const std::string dir = scratch.path();
  fs::copy_file(run + "/coordinator.db", dir + "/coordinator.db");
  CoordinatorOptions o;
  o.db = dir + "/coordinator.db";
  o.log = dir + "/coordinator.log";
  o.metrics_port = 0;
  const ScopedCoordinator coordinator(LATCHKEY_COORDINATOR_BIN, dir, o);
  if (coordinator.ok()) {
    const std::string address = coordinator.address();
    const auto first_line = [](const Captured& c) {
      return nlohmann::json::parse(c.output.substr(0, c.output.find('\n')), nullptr, false);
    };
    // An empty run registry: the uid comes from the coordinator.
    out.status = first_line(Cli(dir, {"--coordinator", address, "--json", "status", job}));
    out.checkpoints = first_line(
        Cli(dir, {"--coordinator", address, "--json", "checkpoints", job, "--dir", shared}));
  }
  return out;
}

// Every step's loss and the final weights equal the uninterrupted run's.
void ExpectSameAsBaseline(const Up& up, const Up& baseline) {
  const auto got = LossByStep(up.jsonl());
  const auto want = LossByStep(baseline.jsonl());
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << baseline.log();
  ASSERT_EQ(got.size(), want.size()) << up.log();
  for (const auto& [step, loss] : want) {
    EXPECT_EQ(Hex(got.at(step)), Hex(loss)) << "step " << step;
  }
  const std::string a = Bytes(up.run() + "/final/model.safetensors");
  ASSERT_FALSE(a.empty()) << up.log();
  EXPECT_TRUE(a == Bytes(baseline.run() + "/final/model.safetensors"))
      << "final/model.safetensors differs from the uninterrupted run's";
}

TEST(SharedCheckpointFolder, TwoJobsOfTwoCoordinatorsEachResumeAndKeepTheirOwn) {
  const ScopedTempDir scratch("shared-ckpt");
  const std::string shared = scratch / "shared";
  for (const char* d : {"a", "b", "base-a", "base-b"}) fs::create_directories(scratch / d);
  // The uninterrupted runs, each with a folder of its own, beside the two jobs.
  Up base_a(scratch / "base-a", Spec(11, "ckpt"));
  Up base_b(scratch / "base-b", Spec(12, "ckpt"));
  // Slow windows (0.3 s) so that the two jobs' saves interleave and a kill lands mid-run.
  const std::vector<std::string> slow = {"LATCHKEY_TEST_MIN_WINDOW_SECONDS=0.3"};
  Up a(scratch / "a", Spec(11, shared), slow);
  const std::string job_a = a.Grab("job          (\\S+)");
  ASSERT_FALSE(job_a.empty()) << a.log();
  const int worker_a = a.WorkerPid();
  ASSERT_GT(worker_a, 0) << a.log();
  // The second job starts once the first has committed a checkpoint: it is warned of it.
  ASSERT_FALSE(WaitForFile(
                   shared + "/step-00000001/manifest.json",
                   [](const std::string& t) { return !t.empty(); }, seconds(240))
                   .empty())
      << a.log();
  Up b(scratch / "b", Spec(12, shared), slow);
  const std::string job_b = b.Grab("job          (\\S+)");
  ASSERT_EQ(job_b, job_a) << b.log();  // two coordinators: the same job id
  const int worker_b = b.WorkerPid();
  ASSERT_GT(worker_b, 0) << b.log();
  const std::string uid_a = a.Json({"status", job_a}).value("job_uid", "");
  const std::string uid_b = b.Json({"status", job_b}).value("job_uid", "");
  ASSERT_EQ(uid_a.size(), 16u) << uid_a;
  ASSERT_EQ(uid_b.size(), 16u) << uid_b;
  ASSERT_NE(uid_a, uid_b);
  EXPECT_TRUE(std::regex_search(
      b.log(), std::regex("latchkey up: warning: latchkey\\.checkpoint\\.dir " + shared +
                          " already holds committed checkpoints of other jobs: " + job_a +
                          " \\(job_uid " + uid_a +
                          ", steps? [0-9, .]+\\)\\. They are kept and "
                          "never touched")))
      << b.log();

  // A worker of each job killed mid-run, after that job has saved some steps the other saved too.
  ASSERT_TRUE(a.WaitForStep(8)) << a.log();
  const int64_t newest_a = a.KillWorker(worker_a, job_a);
  ASSERT_TRUE(b.WaitForStep(8)) << b.log();
  const int64_t newest_b = b.KillWorker(worker_b, job_b);
  ASSERT_GE(newest_a, 1) << a.log();
  ASSERT_GE(newest_b, 1) << b.log();
  ASSERT_EQ(a.Wait(), 0) << a.log();
  ASSERT_EQ(b.Wait(), 0) << b.log();
  ASSERT_EQ(base_a.Wait(), 0) << base_a.log();
  ASSERT_EQ(base_b.Wait(), 0) << base_b.log();

  // Each job recovered once, from its own newest checkpoint, and ended as if never interrupted.
  const Afterwards after_a = ReadBack(a.run(), job_a, shared);
  const Afterwards after_b = ReadBack(b.run(), job_b, shared);
  for (const auto& [after, newest, uid] :
       {std::tuple(after_a, newest_a, uid_a), std::tuple(after_b, newest_b, uid_b)}) {
    ASSERT_TRUE(after.status.is_object()) << after.status.dump();
    EXPECT_EQ(after.status["job_uid"], uid);
    EXPECT_EQ(after.status["state"], "JOB_STATE_SUCCEEDED") << after.status.dump();
    ASSERT_EQ(after.status["attempts"].size(), 2u) << after.status.dump();
    EXPECT_EQ(after.status["attempts"][1]["resume_step"], newest) << after.status.dump();
    std::printf("[SharedCheckpointFolder] job uid %s resumed after step %lld\n", uid.c_str(),
                static_cast<long long>(newest));
  }
  ExpectSameAsBaseline(a, base_a);
  ExpectSameAsBaseline(b, base_b);

  // The folder: the newest `keep` checkpoints of each job, each verifying; nothing else.
  std::map<std::string, std::set<int64_t>> steps_of;  // job uid -> steps
  for (const auto& e : fs::directory_iterator(shared)) {
    const std::string name = e.path().filename().string();
    const nlohmann::json m =
        nlohmann::json::parse(ReadText(e.path().string() + "/manifest.json"), nullptr, false);
    ASSERT_TRUE(m.is_object()) << name << " is not a committed checkpoint";
    EXPECT_EQ(m["job_id"], job_a) << name;
    const std::string uid = m.value("job_uid", "");
    const int64_t step = m["step"].get<int64_t>();
    steps_of[uid].insert(step);
    char plain[32];
    std::snprintf(plain, sizeof(plain), "step-%08lld", static_cast<long long>(step));
    EXPECT_TRUE(name == plain || name == std::string(plain) + "." + uid) << name << " of " << uid;
    const Captured inspect =
        RunAndCapture({LATCHKEY_CLI_BIN, "checkpoint", "inspect", e.path().string()});
    EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
    EXPECT_NE(inspect.output.find("job_uid " + uid), std::string::npos) << inspect.output;
  }
  // The newest three of each, and the one its second attempt resumed from (never pruned).
  const std::set<int64_t> kept_a = {newest_a, 11, 13, 15};
  const std::set<int64_t> kept_b = {newest_b, 11, 13, 15};
  EXPECT_EQ(steps_of[uid_a], kept_a);
  EXPECT_EQ(steps_of[uid_b], kept_b);
  EXPECT_EQ(steps_of.size(), 2u);

  // `latchkey checkpoints` lists each job's own: by the uid its run record keeps, and by the uid
  // its coordinator answers.
  for (const auto& [up, uid, after, kept] :
       {std::tuple(&a, uid_a, &after_a, kept_a), std::tuple(&b, uid_b, &after_b, kept_b)}) {
    const Captured listed = Cli(up->state(), {"--json", "checkpoints", job_a});
    ASSERT_EQ(listed.exit_code, 0) << listed.output;
    const nlohmann::json from_run =
        nlohmann::json::parse(listed.output.substr(0, listed.output.find('\n')), nullptr, false);
    for (const nlohmann::json& j : {from_run, after->checkpoints}) {
      ASSERT_TRUE(j.is_object()) << listed.output;
      EXPECT_EQ(j["job_uid"], uid) << j.dump();
      std::set<int64_t> steps;
      for (const auto& c : j["checkpoints"]) {
        EXPECT_EQ(c["job_uid"], uid) << j.dump();
        steps.insert(c["step"].get<int64_t>());
      }
      EXPECT_EQ(steps, kept) << j.dump();
    }
  }
}

}  // namespace
}  // namespace latchkey::testing
