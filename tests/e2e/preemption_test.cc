// Preemption end to end (docs/fault-tolerance.md "Preemption"): a real coordinator and four
// real workers run DP2 x TP2 with checkpoints every 100 steps (none of the cadence's falls in
// the run: the stop's save is the only one), each window lasting at least 0.3 s. After step 5
// the test interrupts it the way a cluster does and then ends it with replacements:
//  - SIGTERM to every worker (a node drain), to one worker (one node of several), SIGINT to
//    every worker, and `latchkey suspend` then `latchkey resume`: the signalled workers exit 76
//    within the grace, the job is `preempted` (or `suspended`) with no restart spent, and once
//    it ends no completed step was trained twice or lost, every step's loss bit for bit the
//    uninterrupted run's;
//  - SIGTERM with a grace too short for the windows already decided: the workers exit 76 at
//    the grace without the save, the job is recovered from as after a crash (one restart,
//    from the start: the run has no other checkpoint) and still ends as the uninterrupted run.
// Each case runs with asynchronous and with synchronous saves; a table of the measures is
// printed. LATCHKEY_PREEMPTION_MATRIX=full also runs the synchronous variants of every case
// (CI runs them for SIGTERM to every worker).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/job_processes.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using std::chrono::seconds;

constexpr int kSteps = 16;
constexpr int kSignalAfterStep = 5;
constexpr int kExitPreemptedCode = 76;

nlohmann::json Spec(bool async, double grace_seconds) {
  SpecParams p = Dp2Tp2Params(kSteps, 4);
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", 100}, {"async", async}}},
                      {"rejoin_timeout_seconds", 30}};
  if (grace_seconds != 25) p.extra_latchkey["preemption"] = {{"grace_seconds", grace_seconds}};
  return SpecObject(p);
}

bool Ended(const nlohmann::json& s) {
  const std::string st = s.value("state", std::string());
  return st.find("SUCCEEDED") != std::string::npos || st.find("FAILED") != std::string::npos ||
         st.find("CANCELLED") != std::string::npos;
}

std::string State(const nlohmann::json& s) {
  std::string st = s.value("state", std::string());
  if (st.rfind("JOB_STATE_", 0) == 0) st = st.substr(10);
  for (char& ch : st) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return st;
}

// Every record of rank 0 by step (the first process's and its replacement's, in order).
std::map<int64_t, std::vector<nlohmann::json>> RecordsByStep(const std::string& path) {
  std::map<int64_t, std::vector<nlohmann::json>> out;
  for (auto& r : StepRecords(path)) out[r["step"].get<int64_t>()].push_back(r);
  return out;
}

// The uninterrupted run of the spec (saves never happen in it: every_steps 100).
const std::map<int64_t, double>& Reference() {
  static const std::map<int64_t, double> ref = [] {
    const std::string dir = MakeTempDir("preempt-ref");
    JobProcesses c(dir, Spec(true, 25));
    EXPECT_TRUE(c.ok());
    std::vector<int> pids;
    for (int r = 0; r < 4; ++r) pids.push_back(c.StartWorker(r, std::to_string(r)));
    for (int pid : pids) EXPECT_EQ(WaitProcess(pid, seconds(480)), 0);
    std::map<int64_t, double> losses;
    for (auto& [step, records] : RecordsByStep(c.jsonl(0))) {
      losses[step] = records.back()["loss"].get<double>();
    }
    return losses;
  }();
  return ref;
}

enum class Interruption { kSigtermAll, kSigtermOne, kSigintAll, kSuspend, kGraceTooShort };

const char* Name(Interruption i) {
  switch (i) {
    case Interruption::kSigtermAll:
      return "SIGTERM to every worker";
    case Interruption::kSigtermOne:
      return "SIGTERM to one worker";
    case Interruption::kSigintAll:
      return "SIGINT to every worker";
    case Interruption::kSuspend:
      return "latchkey suspend, then resume";
    case Interruption::kGraceTooShort:
      return "SIGTERM, grace too short to save";
  }
  return "?";
}

struct Outcome {
  double seconds_to_exit = -1;  // the slowest signalled (or suspended) worker's exit
  std::string state;            // the job's state once they are gone
  int restarts = -1;            // at the end
  int trained_twice = -1;       // completed steps run again after the interruption
  int lost = -1;                // completed steps not in the checkpoint resumed from
  double max_deviation = -1;    // max |loss - uninterrupted| / uninterrupted, every step
  bool bitwise = false;
};

Outcome RunCase(Interruption what, bool async) {
  Outcome out;
  const bool short_grace = what == Interruption::kGraceTooShort;
  const std::string dir = MakeTempDir("preempt");
  JobProcesses c(dir, Spec(async, short_grace ? 1.0 : 25));
  EXPECT_TRUE(c.ok());
  // Windows of at least 0.3 s (1 s when the grace is too short: three windows still to run
  // outlast its second).
  const std::vector<std::string> slow = {std::string("LATCHKEY_TEST_MIN_WINDOW_SECONDS=") +
                                         (short_grace ? "1" : "0.3")};
  std::vector<int> pids;
  for (int r = 0; r < 4; ++r) pids.push_back(c.StartWorker(r, std::to_string(r), slow));
  WaitForFile(
      c.jsonl(0),
      [](const std::string& t) {
        return t.find("\"step\":" + std::to_string(kSignalAfterStep) + ",") != std::string::npos;
      },
      seconds(300));

  std::vector<int> leaving;  // the processes that must exit 76
  const auto t0 = std::chrono::steady_clock::now();
  switch (what) {
    case Interruption::kSigtermAll:
    case Interruption::kGraceTooShort:
      for (int pid : pids) kill(pid, SIGTERM);
      leaving = pids;
      break;
    case Interruption::kSigintAll:
      for (int pid : pids) kill(pid, SIGINT);
      leaving = pids;
      break;
    case Interruption::kSigtermOne:
      kill(pids[3], SIGTERM);
      leaving = {pids[3]};
      break;
    case Interruption::kSuspend: {
      const Captured s = c.Cli({"suspend", c.job_id()});
      EXPECT_EQ(s.exit_code, 0) << s.output;
      leaving = pids;  // the job suspended, every worker leaves
      break;
    }
  }
  for (int pid : leaving) {
    EXPECT_EQ(WaitProcess(pid, seconds(60)), kExitPreemptedCode) << "pid " << pid;
  }
  out.seconds_to_exit =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Where the job is once they are gone.
  const nlohmann::json stopped = c.WaitStatus(
      [&](const nlohmann::json& s) {
        const std::string st = State(s);
        return short_grace ? st == "recovering" || Ended(s)
                           : st == "preempted" || st == "suspended" || Ended(s);
      },
      seconds(60));
  out.state = State(stopped);
  // Lost: steps completed before the interruption that are not in the newest committed
  // checkpoint, where the job goes on from.
  int64_t completed = -1;
  for (const auto& [step, r] : RecordsByStep(c.jsonl(0))) completed = std::max(completed, step);
  out.lost = static_cast<int>(
      std::max<int64_t>(0, completed - stopped.value("last_checkpoint_step", int64_t{-1})));

  // The replacements (the survivors of a one-node drain join the next attempt themselves).
  std::vector<int> finishing;
  if (what == Interruption::kSigtermOne) {
    finishing = {pids[0], pids[1], pids[2], c.StartWorker(3, "3b")};
  } else {
    if (what == Interruption::kSuspend) {
      const Captured r = c.Cli({"resume", c.job_id()});
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    for (int r = 0; r < 4; ++r) finishing.push_back(c.StartWorker(r, std::to_string(r) + "b"));
  }
  for (int pid : finishing) EXPECT_EQ(WaitProcess(pid, seconds(300)), 0) << "pid " << pid;
  const nlohmann::json s = c.WaitStatus(Ended, seconds(60));
  EXPECT_EQ(State(s), "succeeded") << s.dump();
  out.restarts = s.value("restarts", -1);

  // Steps run again after the interruption (rank 0's file holds both processes' records).
  const auto records = RecordsByStep(c.jsonl(0));
  out.trained_twice = 0;
  for (const auto& [step, r] : records) out.trained_twice += r.size() > 1 ? 1 : 0;
  out.max_deviation = 0;
  out.bitwise = true;
  const auto& ref = Reference();
  for (int64_t step = 0; step < kSteps; ++step) {
    if (!records.count(step) || !ref.count(step)) {
      ADD_FAILURE() << "step " << step << " missing";
      out.bitwise = false;
      continue;
    }
    const double have = records.at(step).back()["loss"].get<double>();
    const double want = ref.at(step);
    out.bitwise = out.bitwise && have == want;
    out.max_deviation = std::max(out.max_deviation, std::abs(have - want) / std::abs(want));
  }
  return out;
}

void Print(Interruption what, bool async, const Outcome& o) {
  std::printf("| %s | %s | %.1f | %s | %d | %d | %d | %.3g | %s |\n", Name(what),
              async ? "async" : "sync", o.seconds_to_exit, o.state.c_str(), o.restarts,
              o.trained_twice, o.lost, o.max_deviation, o.bitwise ? "yes" : "no");
  std::fflush(stdout);
}

bool FullMatrix() {
  const char* m = std::getenv("LATCHKEY_PREEMPTION_MATRIX");
  return m != nullptr && std::string(m) == "full";
}

class Preemption : public ::testing::TestWithParam<std::tuple<Interruption, bool>> {};

TEST_P(Preemption, SavesStopsAndEndsAsTheUninterruptedRun) {
  const auto [what, async] = GetParam();
  (void)Reference();
  const Outcome o = RunCase(what, async);
  std::printf(
      "| case | saves | s to exit | state | restarts | steps twice | steps lost | max "
      "loss deviation | bitwise |\n|---|---|---|---|---|---|---|---|---|\n");
  Print(what, async, o);
  EXPECT_TRUE(o.bitwise);
  EXPECT_EQ(o.max_deviation, 0.0);
  if (what == Interruption::kGraceTooShort) {
    // Exit at the grace (1 s) without the save; recovered from as after a crash.
    EXPECT_LT(o.seconds_to_exit, 10.0);
    EXPECT_EQ(o.restarts, 1);
    return;
  }
  EXPECT_LT(o.seconds_to_exit, 25.0);  // within the default grace
  EXPECT_EQ(o.state, what == Interruption::kSuspend ? "suspended" : "preempted");
  EXPECT_EQ(o.restarts, 0);
  EXPECT_EQ(o.trained_twice, 0);
  EXPECT_EQ(o.lost, 0);
}

// Every case with asynchronous saves, and SIGTERM to every worker with synchronous ones; the
// other synchronous variants are registered with LATCHKEY_PREEMPTION_MATRIX=full only.
std::vector<std::tuple<Interruption, bool>> Cases() {
  std::vector<std::tuple<Interruption, bool>> out;
  for (Interruption i :
       {Interruption::kSigtermAll, Interruption::kSigtermOne, Interruption::kSigintAll,
        Interruption::kSuspend, Interruption::kGraceTooShort}) {
    out.emplace_back(i, true);
    if (i == Interruption::kSigtermAll || FullMatrix()) out.emplace_back(i, false);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Table, Preemption, ::testing::ValuesIn(Cases()));

}  // namespace
}  // namespace latchkey::testing
