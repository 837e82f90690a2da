// `latchkey resume JOB` end to end (docs/fault-tolerance.md "Resuming a job"), with real
// processes in a manual deployment: a coordinator process, two worker processes per attempt
// (Gloo, TP 2) and the CLI. A job cancelled mid-run after a committed checkpoint is resumed,
// its workers are started again, and it succeeds; every step's loss (the last JSONL record of
// each step, both ranks) equals, bit for bit, an uninterrupted job's of the same spec on the
// same coordinator.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kWorld = 2;            // TP 2
constexpr int kSteps = 40;           // enough that the cancel lands mid-run, however fast the steps
constexpr int kCheckpointEvery = 3;  // committed after steps 2, 5, 8, ...

nlohmann::json ResumeSpec() {
  SpecParams p;
  p.steps = kSteps;
  p.seed = 11;
  p.lr = 3e-3;
  p.world_size = kWorld;
  p.data = SyntheticData(4);
  // Relative: each job's checkpoints land beside its own spec file.
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", kCheckpointEvery}}}};
  return SpecObject(p);
}

// Each step's loss, from the last record of the step (a re-run step appends another).
std::map<int64_t, double> LossByStep(const std::string& jsonl) {
  std::map<int64_t, double> out;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step"))
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// The steps of the file's records, in file order.
std::vector<int64_t> RecordedSteps(const std::string& jsonl) {
  std::vector<int64_t> out;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step")) out.push_back(j["step"].get<int64_t>());
  }
  return out;
}

std::string Hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

// The coordinator (tests/support/coordinator_process.h), its database and log in `dir`, and
// the CLI pointed at it.
class Coordinator {
 public:
  explicit Coordinator(const std::string& dir)
      : c_(LATCHKEY_COORDINATOR_BIN, dir, InRunDir(dir, {"--liveness-timeout", "30"})),
        address_(c_.ok() ? c_.address() : "") {}
  const std::string& address() const { return address_; }
  Captured Cli(std::vector<std::string> args) const {
    args.insert(args.begin(), {LATCHKEY_CLI_BIN, "--coordinator", address_});
    return RunAndCapture(args, seconds(120));
  }
  // The first line of `--json ARGS`, parsed (null when it is not JSON).
  nlohmann::json Json(std::vector<std::string> args) const {
    args.insert(args.begin(), "--json");
    const Captured c = Cli(args);
    return nlohmann::json::parse(c.output.substr(0, c.output.find('\n')), nullptr, false);
  }

 private:
  ScopedCoordinator c_;
  std::string address_;
};

struct Submitted {
  std::string job;
  std::string token;
};

// <dir>/spec.json submitted; its checkpoints go to <dir>/ckpt.
Submitted Submit(const Coordinator& c, const std::string& dir) {
  std::ofstream(dir + "/spec.json") << ResumeSpec().dump(2);
  const nlohmann::json j = c.Json({"submit", dir + "/spec.json"});
  EXPECT_TRUE(j.is_object()) << j.dump();
  if (!j.is_object()) return {};
  return {j.value("job_id", ""), j.value("join_token", "")};
}

// One worker per rank, appending to <dir>/steps-R.jsonl and <dir>/worker-R.log (`start` names
// the log of this start).
std::vector<int> StartRanks(const Coordinator& c, const Submitted& s, const std::string& dir,
                            int start) {
  std::vector<int> pids;
  for (int r = 0; r < kWorld; ++r) {
    pids.push_back(StartProcess(
        {WorkerBinary(), "--coordinator", c.address(), "--job", s.job, "--metrics-jsonl",
         dir + "/steps-{rank}.jsonl", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
         "--quiet"},
        {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
         "LOCAL_WORLD_SIZE=" + std::to_string(kWorld), "LATCHKEY_JOIN_TOKEN=" + s.token},
        dir + "/worker-" + std::to_string(r) + "." + std::to_string(start) + ".log"));
  }
  return pids;
}

std::string Logs(const std::string& dir) {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".log") {
      out += "--- " + e.path().filename().string() + "\n" + ReadText(e.path().string());
    }
  }
  return out;
}

// Every worker exits within `deadline`; their exit codes.
std::vector<int> WaitAll(const std::vector<int>& pids, seconds deadline) {
  std::vector<int> codes;
  for (int p : pids) codes.push_back(WaitProcess(p, deadline));
  return codes;
}

TEST(ResumeJob, ACancelledJobResumesFromItsCheckpointAndMatchesAnUninterruptedRun) {
  const ScopedTempDir scratch("resume-job");
  const std::string dir = scratch.path();
  Coordinator c(dir);
  ASSERT_FALSE(c.address().empty()) << ReadText(dir + "/coordinator.log");

  // The uninterrupted job.
  const std::string base_dir = dir + "/baseline";
  std::filesystem::create_directories(base_dir);
  const Submitted base = Submit(c, base_dir);
  ASSERT_FALSE(base.job.empty());
  for (int code : WaitAll(StartRanks(c, base, base_dir, 0), seconds(400))) {
    ASSERT_EQ(code, 0) << Logs(base_dir);
  }
  ASSERT_EQ(c.Json({"status", base.job})["state"], "JOB_STATE_SUCCEEDED") << Logs(base_dir);

  // The same spec, cancelled once the checkpoint after step 5 is committed and step 6 ran.
  const std::string run_dir = dir + "/resumed";
  std::filesystem::create_directories(run_dir);
  const Submitted job = Submit(c, run_dir);
  ASSERT_FALSE(job.job.empty());
  std::vector<int> first = StartRanks(c, job, run_dir, 0);
  const auto until = std::chrono::steady_clock::now() + seconds(300);
  nlohmann::json status;
  while (std::chrono::steady_clock::now() < until) {
    status = c.Json({"status", job.job});
    if (status.is_object() && status.value("last_checkpoint_step", -1) >= 5 &&
        LossByStep(run_dir + "/steps-0.jsonl").count(6) > 0) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_GE(status.value("last_checkpoint_step", -1), 5) << status.dump() << Logs(run_dir);
  const Captured cancelled = c.Cli({"cancel", job.job, "--reason", "the machine is needed"});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.output;
  WaitAll(first, seconds(120));  // they leave through their latch stream
  status = c.Json({"status", job.job});
  ASSERT_EQ(status["state"], "JOB_STATE_CANCELLED") << status.dump();
  const int64_t checkpoint = status["last_checkpoint_step"].get<int64_t>();
  ASSERT_LT(checkpoint, kSteps - 1) << "the job ended before the cancel: " << status.dump();

  // A succeeded job is refused, naming its state (exit 5).
  const Captured refused = c.Cli({"resume", base.job});
  EXPECT_EQ(refused.exit_code, 5) << refused.output;
  EXPECT_NE(
      refused.output.find("is succeeded; only a failed, cancelled or suspended job can be resumed"),
      std::string::npos)
      << refused.output;

  // What the first attempt recorded: the resumed one appends to it.
  std::vector<size_t> first_records;
  for (int r = 0; r < kWorld; ++r) {
    first_records.push_back(
        RecordedSteps(run_dir + "/steps-" + std::to_string(r) + ".jsonl").size());
  }
  const Captured resumed = c.Cli({"resume", job.job});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(job.job +
                                " recovering (attempt 2, resumes from the checkpoint "
                                "after step " +
                                std::to_string(checkpoint) + "); start its workers again"),
            std::string::npos)
      << resumed.output;
  for (int code : WaitAll(StartRanks(c, job, run_dir, 1), seconds(400))) {
    ASSERT_EQ(code, 0) << Logs(run_dir);
  }
  status = c.Json({"status", job.job});
  EXPECT_EQ(status["state"], "JOB_STATE_SUCCEEDED") << status.dump() << Logs(run_dir);
  EXPECT_EQ(status["attempt"], 2) << status.dump();
  EXPECT_EQ(status["restarts"], 0) << status.dump();
  EXPECT_EQ(status["resume_step"], checkpoint) << status.dump();
  const Captured audit = c.Cli({"audit", job.job});
  EXPECT_NE(audit.output.find("resumed"), std::string::npos) << audit.output;

  // The second attempt ran the steps after the checkpoint again: each equals the uninterrupted
  // job's, and so does every step before.
  for (int r = 0; r < kWorld; ++r) {
    const std::string name = "/steps-" + std::to_string(r) + ".jsonl";
    const auto got = LossByStep(run_dir + name);
    const auto want = LossByStep(base_dir + name);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << "baseline rank " << r;
    ASSERT_EQ(got.size(), want.size()) << "rank " << r << "\n" << Logs(run_dir);
    for (const auto& [step, loss] : want) {
      EXPECT_EQ(Hex(got.at(step)), Hex(loss)) << "rank " << r << " step " << step;
    }
    // The resumed attempt ran exactly the steps after the checkpoint, in order.
    const std::vector<int64_t> steps = RecordedSteps(run_dir + name);
    std::vector<int64_t> want_steps;
    for (int64_t s = checkpoint + 1; s < kSteps; ++s) want_steps.push_back(s);
    ASSERT_LE(first_records[static_cast<size_t>(r)], steps.size());
    EXPECT_EQ(std::vector<int64_t>(steps.begin() + static_cast<std::ptrdiff_t>(
                                                       first_records[static_cast<size_t>(r)]),
                                   steps.end()),
              want_steps)
        << "rank " << r;
    std::printf("[ResumeJob] rank %d: steps %lld..%d re-run after the resume, losses equal\n", r,
                static_cast<long long>(checkpoint + 1), kSteps - 1);
  }
}

}  // namespace
}  // namespace latchkey::testing
