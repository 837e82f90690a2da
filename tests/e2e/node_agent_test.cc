// The node agent end to end (docs/deploy.md "One pod per node"): a real coordinator and two
// `latchkey node` agents of two ranks each, with distinct node identities on this machine, run
// DP2 x TP2 (each tensor-parallel group inside one node), compared with four bare workers:
//  - undisturbed: every step's loss bit for bit the bare workers', the agents exit 0;
//  - kill -9 of one local rank: the agent starts it again in place, the job recovers once and
//    ends bit for bit as the undisturbed run;
//  - kill -9 of an agent: its ranks are gone within a second; a replacement agent rejoins the
//    same ranks and the job ends bit for bit;
//  - SIGTERM to an agent: its ranks save with the attempt and leave within the grace, the agent
//    exits 76, the job is preempted with no restart spent, and a replacement finishes it;
//  - one rank per agent with TP 2: the tensor-parallel group spans two nodes and the job is
//    refused before any collective, naming the group, its ranks and nodes, and what to change.
// A table of the cases is printed.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
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

constexpr int kSteps = 12;
constexpr int kExitPreemptedCode = 76;

nlohmann::json Spec() {
  SpecParams p = Dp2Tp2Params(kSteps, 4);
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", 100}}},
                      {"rejoin_timeout_seconds", 60}};
  return SpecObject(p);
}

const std::vector<std::string> kSlow = {"LATCHKEY_TEST_MIN_WINDOW_SECONDS=0.3"};

std::string State(const nlohmann::json& s) {
  std::string st = s.value("state", std::string());
  if (st.rfind("JOB_STATE_", 0) == 0) st = st.substr(10);
  for (char& ch : st) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return st;
}

bool Ended(const nlohmann::json& s) {
  const std::string st = State(s);
  return st == "succeeded" || st == "failed" || st == "cancelled";
}

// Rank 0's loss per step, the last record of each (a restarted process appends).
std::map<int64_t, double> Losses(const std::string& jsonl) {
  std::map<int64_t, double> out;
  for (auto& r : StepRecords(jsonl)) out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  return out;
}

// The bare workers' run of the spec.
const std::map<int64_t, double>& Reference() {
  static const std::map<int64_t, double> ref = [] {
    const std::string dir = MakeTempDir("node-ref");
    JobProcesses c(dir, Spec());
    EXPECT_TRUE(c.ok());
    std::vector<int> pids;
    for (int r = 0; r < 4; ++r) pids.push_back(c.StartWorker(r, std::to_string(r)));
    for (int pid : pids) EXPECT_EQ(WaitProcess(pid, seconds(300)), 0);
    return Losses(c.jsonl(0));
  }();
  return ref;
}

// The agent's children (its local ranks' processes): every process whose parent it is.
std::vector<int> Children(int pid) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

bool Alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
}

void WaitStep(const JobProcesses& c, int step) {
  WaitForFile(
      c.jsonl(0),
      [&](const std::string& t) {
        return t.find("\"step\":" + std::to_string(step) + ",") != std::string::npos;
      },
      seconds(300));
}

// Two agents of two ranks each (node-a: ranks 0-1, node-b: ranks 2-3), windows of at least
// 0.3 s; Start() returns once rank 0 has finished step 4.
struct TwoAgents {
  explicit TwoAgents(const char* name) : dir(MakeTempDir(name)), c(dir, Spec()) {}
  void Start() {
    a = c.StartNode(0, 2, "node-a", "a", kSlow);
    b = c.StartNode(1, 2, "node-b", "b", kSlow);
    WaitStep(c, 4);
  }
  std::string dir;
  JobProcesses c;
  int a = -1;
  int b = -1;
};

struct Outcome {
  std::string state;
  int restarts = -1;
  bool bitwise = false;
  std::string note;
};

// The job's end: its state, restarts, and whether rank 0's losses equal the bare workers'.
Outcome Finish(const JobProcesses& c) {
  Outcome o;
  const nlohmann::json s = c.WaitStatus(Ended, seconds(120));
  o.state = State(s);
  o.restarts = s.value("restarts", -1);
  const std::map<int64_t, double> have = Losses(c.jsonl(0));
  const std::map<int64_t, double>& want = Reference();
  EXPECT_EQ(have.size(), static_cast<size_t>(kSteps));
  o.bitwise = have == want && !want.empty();
  return o;
}

void Print(const char* name, const Outcome& o) {
  std::printf("| %s | %s | %d | %s | %s |\n", name, o.state.c_str(), o.restarts,
              o.bitwise ? "yes" : "no", o.note.c_str());
  std::fflush(stdout);
}

TEST(NodeAgent, TwoAgentsTrainAsFourBareWorkers) {
  (void)Reference();
  const std::string dir = MakeTempDir("node");
  JobProcesses c(dir, Spec());
  ASSERT_TRUE(c.ok());
  const int a = c.StartNode(0, 2, "node-a", "a");
  const int b = c.StartNode(1, 2, "node-b", "b");
  EXPECT_EQ(WaitProcess(a, seconds(300)), 0) << ReadText(dir + "/node-a.out");
  EXPECT_EQ(WaitProcess(b, seconds(300)), 0) << ReadText(dir + "/node-b.out");
  Outcome o = Finish(c);
  o.note = "agents exit 0";
  Print("undisturbed", o);
  EXPECT_EQ(o.state, "succeeded");
  EXPECT_EQ(o.restarts, 0);
  EXPECT_TRUE(o.bitwise);
  // Each rank's records where `latchkey up` keeps them, and the agent's own log.
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(StepRecords(c.jsonl(r)).empty()) << "rank " << r;
    EXPECT_NE(ReadText(dir + "/worker-" + std::to_string(r) + ".log"), "") << "rank " << r;
  }
  EXPECT_NE(ReadText(dir + "/node-1.log").find("ranks 2..3"), std::string::npos);
  // Every heartbeat and step report went through the agent's relay, in node calls of more
  // than one rank (client/node_relay.h).
  for (const std::string node : {"0", "1"}) {
    const std::string log = ReadText(dir + "/node-" + node + ".log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m,
                                  std::regex("relay +([0-9]+) heartbeats in ([0-9]+) node calls, "
                                             "([0-9]+) step reports in ([0-9]+) node calls")))
        << log;
    const int heartbeats = std::stoi(m[1]), heartbeat_calls = std::stoi(m[2]);
    const int reports = std::stoi(m[3]), report_calls = std::stoi(m[4]);
    EXPECT_EQ(reports, 2 * kSteps) << log;  // both local ranks, every step
    EXPECT_LT(report_calls, reports) << log;
    EXPECT_GE(report_calls, kSteps) << log;
    EXPECT_GT(heartbeats, 0) << log;
    EXPECT_LT(heartbeat_calls, heartbeats) << log;
  }
}

TEST(NodeAgent, AKilledLocalRankIsStartedAgainInPlace) {
  (void)Reference();
  TwoAgents t("node-kill-rank");
  ASSERT_TRUE(t.c.ok());
  t.Start();
  const std::string& dir = t.dir;
  JobProcesses& c = t.c;
  const int a = t.a, b = t.b;
  const std::vector<int> ranks = Children(b);
  ASSERT_EQ(ranks.size(), 2u) << ReadText(dir + "/node-b.out") << ReadText(c.jsonl(0));
  kill(ranks[1], SIGKILL);
  EXPECT_EQ(WaitProcess(a, seconds(300)), 0) << ReadText(dir + "/node-a.out");
  EXPECT_EQ(WaitProcess(b, seconds(300)), 0) << ReadText(dir + "/node-b.out");
  Outcome o = Finish(c);
  const std::string log = ReadText(dir + "/node-1.log");
  o.note = "started again by its agent";
  Print("kill -9 of one local rank", o);
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
  // Its log has both processes' lines (a restart appends).
  const std::string rank_log = ReadText(dir + "/worker-3.log");
  size_t starts = 0;
  for (size_t at = rank_log.find("logs to"); at != std::string::npos;
       at = rank_log.find("logs to", at + 1)) {
    ++starts;
  }
  EXPECT_EQ(starts, 2u) << rank_log;
  EXPECT_EQ(o.state, "succeeded");
  EXPECT_EQ(o.restarts, 1);  // one recovery, whatever number of processes it took
  EXPECT_TRUE(o.bitwise);
}

TEST(NodeAgent, AKilledAgentTakesItsRanksAndAReplacementRejoins) {
  (void)Reference();
  TwoAgents t("node-kill-agent");
  ASSERT_TRUE(t.c.ok());
  t.Start();
  const std::string& dir = t.dir;
  JobProcesses& c = t.c;
  const int a = t.a, b = t.b;
  const std::vector<int> ranks = Children(b);
  ASSERT_EQ(ranks.size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  kill(b, SIGKILL);
  (void)WaitProcess(b, seconds(10));
  double gone_s = -1;
  while (std::chrono::steady_clock::now() - t0 < seconds(5)) {
    if (!Alive(ranks[0]) && !Alive(ranks[1])) {
      gone_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int b2 = c.StartNode(1, 2, "node-b", "b2", kSlow);
  EXPECT_EQ(WaitProcess(a, seconds(300)), 0) << ReadText(dir + "/node-a.out");
  EXPECT_EQ(WaitProcess(b2, seconds(300)), 0) << ReadText(dir + "/node-b2.out");
  Outcome o = Finish(c);
  o.note = "ranks gone in " + std::to_string(gone_s) + " s";
  Print("kill -9 of an agent, then a replacement", o);
  EXPECT_GE(gone_s, 0.0) << "the killed agent's ranks still run after 5 s";
  EXPECT_LT(gone_s, 1.0);
  EXPECT_EQ(o.state, "succeeded");
  EXPECT_EQ(o.restarts, 1);
  EXPECT_TRUE(o.bitwise);
}

TEST(NodeAgent, SigtermToAnAgentSavesAndLeavesWithinTheGrace) {
  (void)Reference();
  TwoAgents t("node-sigterm");
  ASSERT_TRUE(t.c.ok());
  t.Start();
  const std::string& dir = t.dir;
  JobProcesses& c = t.c;
  const int a = t.a, b = t.b;
  const auto t0 = std::chrono::steady_clock::now();
  kill(b, SIGTERM);
  EXPECT_EQ(WaitProcess(b, seconds(60)), kExitPreemptedCode) << ReadText(dir + "/node-b.out");
  const double exit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const nlohmann::json stopped = c.WaitStatus(
      [](const nlohmann::json& s) { return State(s) == "preempted" || Ended(s); }, seconds(60));
  EXPECT_EQ(State(stopped), "preempted") << stopped.dump();
  const int b2 = c.StartNode(1, 2, "node-b", "b2", kSlow);
  EXPECT_EQ(WaitProcess(a, seconds(300)), 0) << ReadText(dir + "/node-a.out");
  EXPECT_EQ(WaitProcess(b2, seconds(300)), 0) << ReadText(dir + "/node-b2.out");
  Outcome o = Finish(c);
  o.note = "agent exit 76 after " + std::to_string(exit_s) + " s; preempted";
  Print("SIGTERM to an agent, then a replacement", o);
  EXPECT_LT(exit_s, 25.0);  // within the default grace
  EXPECT_EQ(o.state, "succeeded");
  EXPECT_EQ(o.restarts, 0);
  EXPECT_TRUE(o.bitwise);
}

TEST(NodeAgent, ATensorParallelGroupAcrossNodesIsRefusedBeforeAnyCollective) {
  const std::string dir = MakeTempDir("node-topology");
  JobProcesses c(dir, Spec());
  ASSERT_TRUE(c.ok());
  std::vector<int> agents;
  const char* names[] = {"node-a", "node-b", "node-c", "node-d"};
  for (int k = 0; k < 4; ++k) agents.push_back(c.StartNode(k, 1, names[k], names[k]));
  for (int pid : agents) {
    const int code = WaitProcess(pid, seconds(120));
    EXPECT_NE(code, 0);
    EXPECT_NE(code, -1) << "still running";
  }
  const nlohmann::json s = c.WaitStatus(Ended, seconds(30));
  EXPECT_EQ(State(s), "failed");
  const std::string why = s.dump();
  EXPECT_NE(why.find("tensor-parallel group 0 (ranks 0..1) spans nodes: rank 0 on node-a, "
                     "rank 1 on node-b"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("--nproc a multiple of tensor_parallel.autotp_size (2)"), std::string::npos)
      << why;
  // Before any collective: no rank trained a step.
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(StepRecords(c.jsonl(r)).empty()) << "rank " << r;
  Outcome o;
  o.state = State(s);
  o.restarts = s.value("restarts", -1);
  o.note = "refused: TP group across nodes";
  Print("one rank per agent, TP 2", o);
}

TEST(NodeAgent, WhatItCannotResolveIsNamedWithItsVariable) {
  unsetenv("LATCHKEY_JOB_ID");
  unsetenv("JOB_COMPLETION_INDEX");
  unsetenv("LATCHKEY_JOIN_TOKEN");
  const std::string dir = MakeTempDir("node-usage");
  const std::string bin = LATCHKEY_CLI_BIN;
  Captured c = RunAndCapture({bin, "node", "--nproc", "2", "--run-dir", dir}, seconds(30));
  EXPECT_EQ(c.exit_code, 3) << c.output;
  EXPECT_NE(c.output.find("--job: required (or LATCHKEY_JOB_ID)"), std::string::npos) << c.output;
  c = RunAndCapture({bin, "node", "--nproc", "2", "--job", "j", "--run-dir", dir}, seconds(30));
  EXPECT_EQ(c.exit_code, 3) << c.output;
  EXPECT_NE(c.output.find("--node-rank: required (or JOB_COMPLETION_INDEX"), std::string::npos)
      << c.output;
  c = RunAndCapture(
      {bin, "node", "--nproc", "2", "--job", "j", "--node-rank", "0", "--run-dir", dir},
      seconds(30));
  EXPECT_EQ(c.exit_code, 3) << c.output;
  EXPECT_NE(c.output.find("--join-token-file: required (or LATCHKEY_JOIN_TOKEN)"),
            std::string::npos)
      << c.output;
  c = RunAndCapture({bin, "node", "--job", "j"}, seconds(30));
  EXPECT_EQ(c.exit_code, 2) << c.output;  // --nproc is required
}

}  // namespace
}  // namespace latchkey::testing
