// A job run by separate processes, as a manual deployment runs one: a latchkey-coordinator
// (liveness 5 s unless told otherwise) with its database and log in `dir`, the job submitted
// from `dir`/spec.json by the CLI, and latchkey-worker processes the test starts, each with
// RANK and LOCAL_WORLD_SIZE, writing `dir`/steps-{rank}.jsonl and `dir`/worker-TAG.log. The
// workers still running are killed (-9) and the coordinator stopped when it goes.
//
// Header-only: it needs the test target's LATCHKEY_COORDINATOR_BIN and LATCHKEY_CLI_BIN
// (latchkey_process_test NEEDS coordinator cli worker).
#ifndef LATCHKEY_TESTS_SUPPORT_JOB_PROCESSES_H_
#define LATCHKEY_TESTS_SUPPORT_JOB_PROCESSES_H_

#include <signal.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/free_port.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"

namespace latchkey::testing {

// The small DP2xTP2 job these tests run as separate processes (four ranks, ZeRO-1, AdamW,
// synthetic data): `steps` steps of `gas` micro-batches; checkpoints are the caller's.
inline SpecParams Dp2Tp2Params(int steps, int gas) {
  SpecParams p;
  p.micro_batch = 2;
  p.gas = gas;
  p.zero_stage = 1;
  p.optimizer = "AdamW";
  p.lr = 3e-3;
  p.tp = 2;
  p.seq_len = 32;
  p.steps = steps;
  p.seed = 11;
  p.world_size = 4;
  p.data = SyntheticData(7);
  return p;
}

class JobProcesses {
 public:
  JobProcesses(const std::string& dir, const nlohmann::json& spec,
               const std::vector<std::string>& coordinator_flags = {"--liveness-timeout", "5"})
      : dir_(dir), coord_(LATCHKEY_COORDINATOR_BIN, dir, InRunDir(dir, coordinator_flags)) {
    std::ofstream(dir + "/spec.json") << spec.dump(2);
    if (!coord_.ok()) return;
    address_ = coord_.address();
    const Captured sub = Cli(
        {"--json", "submit", dir + "/spec.json", "--rendezvous-port", std::to_string(FreePort())});
    auto s = nlohmann::json::parse(sub.output.substr(sub.output.find('{')), nullptr, false);
    if (s.is_discarded()) return;
    job_ = s.contains("job_id") ? s["job_id"] : s["jobId"];
    token_ = s.contains("join_token") ? s["join_token"] : s["joinToken"];
  }
  ~JobProcesses() {
    for (int pid : workers_) {
      if (pid > 0) kill(pid, SIGKILL), WaitProcess(pid, std::chrono::seconds(10));
    }
  }
  bool ok() const { return !job_.empty(); }
  std::string jsonl(int rank) const { return dir_ + "/steps-" + std::to_string(rank) + ".jsonl"; }

  int StartWorker(int rank, const std::string& tag, std::vector<std::string> env = {}) {
    env.insert(env.begin(), {"RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=4"});
    const int pid =
        StartProcess({WorkerBinary(), "--coordinator", address_, "--job", job_, "--join-token",
                      token_, "--metrics-jsonl", dir_ + "/steps-{rank}.jsonl", "--quiet"},
                     env, dir_ + "/worker-" + tag + ".log");
    workers_.push_back(pid);
    return pid;
  }
  // A node agent (`latchkey node`) for ranks node_rank*nproc .. +nproc-1, named `node_name`,
  // its run folder `dir`: steps-R.jsonl and worker-R.log as bare workers write them here, its
  // own output in node-TAG.out. Killed (-9) with the rest when this goes.
  int StartNode(int node_rank, int nproc, const std::string& node_name, const std::string& tag,
                std::vector<std::string> env = {}) {
    env.push_back("LATCHKEY_JOIN_TOKEN=" + token_);
    const int pid = StartProcess(
        {LATCHKEY_CLI_BIN, "--coordinator", address_, "node", "--job", job_, "--nproc",
         std::to_string(nproc), "--node-rank", std::to_string(node_rank), "--node-name", node_name,
         "--run-dir", dir_, "--worker", WorkerBinary(), "--", "--quiet"},
        env, dir_ + "/node-" + tag + ".out");
    workers_.push_back(pid);
    return pid;
  }
  Captured Cli(std::vector<std::string> args) const {
    args.insert(args.begin(), {LATCHKEY_CLI_BIN, "--coordinator", address_});
    return RunAndCapture(args, std::chrono::seconds(60));
  }
  nlohmann::json Status() const {
    const Captured c = Cli({"--json", "status", job_});
    const std::string first = c.output.substr(0, c.output.find('\n'));
    auto j = nlohmann::json::parse(first, nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j;
  }
  // Polls status until `pred` holds (or `deadline`); the last status.
  template <typename Pred>
  nlohmann::json WaitStatus(Pred pred, std::chrono::seconds deadline) const {
    const auto until = std::chrono::steady_clock::now() + deadline;
    nlohmann::json s = Status();
    while (!pred(s) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      s = Status();
    }
    return s;
  }
  const std::string& job_id() const { return job_; }
  const std::string& dir() const { return dir_; }
  std::string log(const std::string& tag) const {
    return ReadText(dir_ + "/worker-" + tag + ".log");
  }

 private:
  std::string dir_;
  ScopedCoordinator coord_;
  std::string address_, job_, token_;
  std::vector<int> workers_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_JOB_PROCESSES_H_
