// `latchkey node`: the node agent (docs/deploy.md "One pod per node"). One per node (a pod of
// an Indexed Job, a machine): it starts the node's ranks K·N .. K·N+N-1 as latchkey-worker
// processes, keeps them alive with `latchkey up`'s supervisor (a local rank that dies is started
// again in place at once; the job recovers as after any crash), takes them with it when it dies
// (their parent-death signal), and passes a stop signal on to them (the attempt saves and
// stops, docs/fault-tolerance.md "Preemption").
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/up.h"
#include "client/node_relay.h"
#include "common/cli_checks.h"
#include "common/subprocess.h"
#include "common/worker_protocol.h"
#include "proto/channel.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

struct NodeOptions {
  int nproc = 0;
  std::string job;        // default $LATCHKEY_JOB_ID
  int node_rank = -1;     // default $JOB_COMPLETION_INDEX
  std::string node_name;  // default $LATCHKEY_NODE_NAME, else the host name
  std::string run_dir = ".";
  int metrics_port_base = -1;  // >= 0: rank-local i serves its metrics on base + i
  std::string join_token_file;
  std::string worker;  // default: next to this binary, else PATH
  std::vector<std::string> worker_args;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The settings the flags leave to the environment, resolved; INVALID_ARGUMENT naming the flag
// and its variable when one is missing or not a number.
absl::Status Resolve(NodeOptions& o, std::string* join_token) {
  if (o.job.empty()) o.job = Env("LATCHKEY_JOB_ID");
  if (o.job.empty()) return absl::InvalidArgumentError("--job: required (or LATCHKEY_JOB_ID)");
  if (o.node_rank < 0) {
    const std::string index = Env("JOB_COMPLETION_INDEX");
    char* end = nullptr;
    const long k = index.empty() ? -1 : std::strtol(index.c_str(), &end, 10);
    if (index.empty() || *end != 0 || k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--node-rank: required (or JOB_COMPLETION_INDEX, an Indexed Job's pod)",
                       index.empty() ? ""
                                     : absl::StrCat("; JOB_COMPLETION_INDEX is '", index,
                                                    "', not a non-negative integer")));
    }
    o.node_rank = static_cast<int>(k);
  }
  if (o.node_name.empty()) o.node_name = Env("LATCHKEY_NODE_NAME");
  if (o.node_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.node_name = host;
  }
  *join_token = Env("LATCHKEY_JOIN_TOKEN");
  if (!o.join_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadJoinTokenFile(o.join_token_file);
    if (!token.ok()) return token.status();
    *join_token = *std::move(token);
  }
  if (join_token->empty()) {
    return absl::InvalidArgumentError("--join-token-file: required (or LATCHKEY_JOIN_TOKEN)");
  }
  std::error_code ec;
  fs::create_directories(o.run_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError("--run-dir: cannot make '" + o.run_dir +
                                       "': " + ec.message());
  }
  o.run_dir = AbsoluteFolder(o.run_dir);
  if (o.worker.empty()) o.worker = FindBinary("latchkey-worker", "worker");
  return absl::OkStatus();
}

// Rank `rank`'s worker: the node's identity, its local rank, the job's settings, the worker
// arguments given after `--`.
SpawnOptions WorkerCommand(const CliContext& ctx, const NodeOptions& o,
                           const std::string& join_token, const std::string& relay, int rank) {
  const int local = rank - o.node_rank * o.nproc;
  SpawnOptions w;
  w.args = {o.worker,
            "--coordinator",
            ctx.coordinator,
            "--job",
            o.job,
            "--metrics-jsonl",
            o.run_dir + "/steps-{rank}.jsonl",
            "--trace-jsonl",
            o.run_dir + "/trace-{rank}.jsonl",
            "--port-file",
            o.run_dir + "/worker-{rank}.port.json",
            "--log-steps"};
  if (o.metrics_port_base >= 0) {
    w.args.insert(w.args.end(), {"--metrics-port", std::to_string(o.metrics_port_base + local)});
  }
  w.args.insert(w.args.end(), o.worker_args.begin(), o.worker_args.end());
  // The token in the environment, not on the command line (`ps`); TLS as the agent was told.
  w.extra_env = {"RANK=" + std::to_string(rank),
                 "LOCAL_RANK=" + std::to_string(local),
                 "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc),
                 "LATCHKEY_NODE_NAME=" + o.node_name,
                 "LATCHKEY_NODE_RELAY=" + relay,
                 "LATCHKEY_JOIN_TOKEN=" + join_token,
                 "LATCHKEY_TLS_CA=" + ctx.credentials.tls_ca,
                 "LATCHKEY_TLS_CERT=" + ctx.credentials.tls_cert,
                 "LATCHKEY_TLS_KEY=" + ctx.credentials.tls_key};
  w.log_path = o.run_dir + "/worker-" + std::to_string(rank) + ".log";
  // Its own process group (a terminal's Ctrl-C reaches the agent, which passes it on once), and
  // gone with the agent: a pod's replacement rejoins these ranks, nothing of the old one lingers.
  w.own_process_group = true;
  w.parent_death_signal = SIGKILL;
  return w;
}

// The agent's exit code from its ranks' last exits: kExitPreempted when one left on a stop
// signal (a pod's supervisor replaces the pod without counting a failure), else the first
// that failed (128 + signal for a signal), else 0.
int NodeExitCode(const std::vector<std::optional<ExitInfo>>& exits) {
  for (const auto& e : exits) {
    if (e && e->signal == 0 && e->code == kExitPreempted) return kExitPreempted;
  }
  for (const auto& e : exits) {
    if (e && e->combined() != 0) return e->combined();
  }
  return kOk;
}

int RunNode(const CliContext& ctx, NodeOptions o) {
  // Stop signals go to one thread (sigwait), blocked from the start (the workers unblock them).
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::string join_token;
  if (absl::Status st = Resolve(o, &join_token); !st.ok()) return Fail(st);
  const std::string log_path = o.run_dir + "/node-" + std::to_string(o.node_rank) + ".log";
  auto log = std::make_shared<std::ofstream>(log_path, std::ios::app);
  const auto say = [log](const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(OutputMutex());
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    *log << line << std::endl;
  };
  const int first = o.node_rank * o.nproc;
  say(absl::StrCat("node         ", o.node_name, "  node rank ", o.node_rank, "  ranks ", first,
                   "..", first + o.nproc - 1, "  job ", o.job, " at ", ctx.coordinator,
                   "  (run folder ", o.run_dir, ")"));

  // The ranks' heartbeats and step reports go to the coordinator in node calls
  // (client/node_relay.h), over a socket of this network namespace.
  const ClientOptions client = ctx.client_options();
  auto channel = MakeCoordinatorChannel(ctx.coordinator, client.credentials);
  if (!channel.ok()) return Fail(channel.status());
  NodeRelayOptions ro;
  ro.listen = absl::StrCat("unix-abstract:latchkey-node-", getpid());
  ro.node = o.node_name;
  ro.local_ranks = o.nproc;
  absl::StatusOr<std::unique_ptr<NodeRelay>> relay = NodeRelay::Start(ro, *channel);
  if (!relay.ok()) return Fail(relay.status());

  SupervisorConfig sc;
  sc.client = client;
  sc.job_id = o.job;
  sc.join_token = join_token;
  sc.run_dir = o.run_dir;
  sc.world = o.nproc;
  sc.first_rank = first;
  sc.on_line = say;
  sc.worker = [ctx, o, join_token, address = ro.listen](int rank) {
    return WorkerCommand(ctx, o, join_token, address, rank);
  };
  UpSupervisor supervisor(sc);

  std::thread signals([&] {
    for (bool first_signal = true;; first_signal = false) {
      int sig = 0;
      sigwait(&sigs, &sig);
      if (sig == SIGUSR1) return;  // the agent is done
      const std::vector<pid_t> pids = supervisor.WorkerPids();
      if (first_signal) {
        say(absl::StrCat("node         ", strsignal(sig), ": passing it on to ", pids.size(),
                         " rank(s); they save with the job and leave (a second signal kills "
                         "them)"));
        supervisor.Stop();  // no more restarts
        for (pid_t p : supervisor.WorkerPids()) kill(p, sig);
      } else {
        say(absl::StrCat("node         ", strsignal(sig), " again: killing the ranks"));
        for (pid_t p : pids) kill(p, SIGKILL);
      }
    }
  });
  const auto end_signal_thread = [&] {
    pthread_kill(signals.native_handle(), SIGUSR1);
    signals.join();
  };

  if (absl::Status st = supervisor.Start(); !st.ok()) {
    supervisor.Stop();
    StopAll(supervisor.WorkerPids(), std::chrono::seconds(5));
    end_signal_thread();
    return Fail(st);
  }
  supervisor.AwaitAllEnded();  // every rank ended for good, or a stop signal came
  // After a stop signal: the ranks save with the rest of the attempt and leave (the pod's grace
  // bounds this; SIGKILL to the agent takes them too).
  std::vector<std::optional<ExitInfo>> exits = supervisor.LastExits();
  for (pid_t pid : supervisor.WorkerPids()) {
    std::optional<ExitInfo> e;
    while (!(e = PollExit(pid))) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    say(absl::StrCat("worker ", pid, "  ", DescribeExit(*e)));
    exits.push_back(e);
  }
  supervisor.Stop();
  end_signal_thread();
  const NodeRelayCounts n = (*relay)->counts();
  say(absl::StrCat("relay        ", n.heartbeats, " heartbeats in ", n.node_heartbeats,
                   " node calls, ", n.reports, " step reports in ", n.report_calls, " node calls"));
  const int code = NodeExitCode(exits);
  say(absl::StrCat(
      "node         done: exit ", code,
      code == kExitPreempted ? " (its ranks left on a stop signal: replace the node)" : ""));
  return code;
}

}  // namespace

void AddNodeCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto opts = std::make_shared<NodeOptions>();
  CLI::App* node = app.add_subcommand(
      "node", "Run one node's ranks of a job: the node agent (one per node, e.g. a pod)");
  node->add_option("--nproc", opts->nproc,
                   "ranks on this node (its GPUs); a multiple of tensor_parallel.autotp_size")
      ->required()
      ->check(Positive());
  node->add_option("--job", opts->job, "job id (default $LATCHKEY_JOB_ID)");
  node->add_option("--node-rank", opts->node_rank,
                   "this node's index K: it runs ranks K*nproc .. K*nproc+nproc-1 (default "
                   "$JOB_COMPLETION_INDEX)")
      ->check(NonNegative());
  node->add_option("--node-name", opts->node_name,
                   "this node's identity, which a tensor-parallel group must share (default "
                   "$LATCHKEY_NODE_NAME, else the host name)");
  node->add_option("--run-dir", opts->run_dir,
                   "folder for worker-R.log, steps-R.jsonl and node-K.log (default: here)");
  node->add_option("--metrics-port-base", opts->metrics_port_base,
                   "local rank i serves its metrics on this port + i (default: any free port)")
      ->check(CLI::Range(0, 65535));
  node->add_option("--join-token-file", opts->join_token_file,
                   "file holding the job's join token (default $LATCHKEY_JOIN_TOKEN)");
  node->add_option("--worker", opts->worker,
                   "the latchkey-worker binary (default: next to latchkey, else PATH)");
  node->add_option("worker-args", opts->worker_args,
                   "after --: flags every rank's latchkey-worker gets (e.g. --advertise-host)");
  node->footer(
      "Each rank gets RANK, LOCAL_RANK, LOCAL_WORLD_SIZE=nproc and LATCHKEY_NODE_NAME; the "
      "rest of the environment passes through. A rank that dies is started again in place. "
      "SIGTERM/SIGINT pass on to the ranks (the attempt saves and stops); the agent then exits "
      "76. Its death kills its ranks. Exit: 0 when the job succeeded, 76 when its ranks left on "
      "a stop signal, else the first failed rank's code.");
  node->callback([&ctx, opts, exit_code] { *exit_code = RunNode(ctx, *opts); });
}

}  // namespace latchkey::cli
