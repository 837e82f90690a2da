#include "tests/cluster/cluster_job.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"

namespace latchkey::testing {
namespace {

constexpr int kCoordinatorPort = 50051;

std::string ReadPid(const std::string& path) {
  std::string text = ReadText(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterJob>> ClusterJob::Start(const std::string& dir,
                                                              ClusterJobOptions o) {
  std::unique_ptr<ClusterJob> job(new ClusterJob(dir, std::move(o)));
  auto cluster = SimCluster::Create(1 + job->o_.worker_hosts);
  if (!cluster.ok()) return cluster.status();
  job->cluster_ = *std::move(cluster);
  if (absl::Status st = job->Launch(); !st.ok()) return st;
  return job;
}

ClusterJob::~ClusterJob() = default;  // the cluster's destructor kills every process on it

std::string ClusterJob::Cli(const std::vector<std::string>& args, int* exit_code) const {
  std::vector<std::string> argv = {SimHostsScript(),
                                   "exec",
                                   cluster_->name(),
                                   std::to_string(kCoordinatorHost),
                                   "env",
                                   "LATCHKEY_TOKEN=" + token_,
                                   LATCHKEY_CLI_BIN,
                                   "--coordinator",
                                   address_};
  argv.insert(argv.end(), args.begin(), args.end());
  const Captured c = RunAndCapture(argv, std::chrono::seconds(20));
  if (exit_code != nullptr) *exit_code = c.exit_code;
  return c.output;
}

absl::Status ClusterJob::Launch() {
  std::filesystem::create_directories(dir_ + "/final");
  token_ = "cluster-admin-token-" + std::to_string(getpid());
  const std::string tokens = dir_ + "/auth-tokens";
  std::ofstream(tokens) << "admin test " << Sha256Hex(token_) << "\n";
  chmod(tokens.c_str(), 0600);
  address_ = absl::StrCat(SimCluster::Address(kCoordinatorHost), ":", kCoordinatorPort);
  std::vector<std::string> coord = {
      LATCHKEY_COORDINATOR_BIN, "--listen",       address_, "--db",
      dir_ + "/coordinator.db", "--auth-tokens",  tokens,   "--port-file",
      dir_ + "/ports.json",     "--metrics-port", "-1"};
  coord.insert(coord.end(), o_.coordinator_flags.begin(), o_.coordinator_flags.end());
  coordinator_argv_ = coord;
  if (absl::Status st = StartCoordinator(); !st.ok()) return st;

  const std::string spec_path = dir_ + "/spec.json";
  std::ofstream(spec_path) << o_.spec.dump(2);
  int code = 0;
  const std::string out = Cli({"--json", "submit", spec_path}, &code);
  if (code != 0) return absl::InternalError("submit: " + out);
  nlohmann::json submitted;
  try {
    submitted = nlohmann::json::parse(out.substr(out.find('{')));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("submit: ", e.what(), ": ", out));
  }
  job_id_ = submitted.value("job_id", "");
  const std::string join_token = submitted.value("join_token", "");
  if (job_id_.empty() || join_token.empty()) return absl::InternalError("submit: " + out);

  const int world = o_.worker_hosts * o_.ranks_per_host;
  if (o_.node_agents) {
    for (int node = 0; node < o_.worker_hosts; ++node) {
      const int host = HostOf(node * o_.ranks_per_host);
      const std::string ip = SimCluster::Address(host);
      std::vector<std::string> argv = {LATCHKEY_CLI_BIN,
                                       "--coordinator",
                                       address_,
                                       "node",
                                       "--job",
                                       job_id_,
                                       "--nproc",
                                       std::to_string(o_.ranks_per_host),
                                       "--node-rank",
                                       std::to_string(node),
                                       "--node-name",
                                       ip,
                                       "--run-dir",
                                       dir_,
                                       "--worker",
                                       LATCHKEY_WORKER_BIN,
                                       "--",
                                       "--advertise-host",
                                       ip,
                                       "--save",
                                       dir_ + "/final",
                                       "--collective-timeout-seconds",
                                       std::to_string(o_.collective_timeout_s),
                                       "--quiet"};
      argv.insert(argv.end(), o_.worker_flags.begin(), o_.worker_flags.end());
      cluster_->StartSupervised(
          host, argv, {"LATCHKEY_JOIN_TOKEN=" + join_token, "LATCHKEY_GLOO_HOSTNAME=" + ip},
          absl::StrCat(dir_, "/node-", node, ".out"), absl::StrCat(dir_, "/node-", node, ".pid"));
    }
    return absl::OkStatus();
  }
  for (int r = 0; r < world; ++r) {
    const int host = HostOf(r);
    const std::string ip = SimCluster::Address(host);
    const std::vector<std::string> env = {
        absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r % o_.ranks_per_host),
        absl::StrCat("LOCAL_WORLD_SIZE=", o_.ranks_per_host), "LATCHKEY_JOIN_TOKEN=" + join_token,
        "LATCHKEY_GLOO_HOSTNAME=" + ip};
    const std::vector<std::string> argv = {LATCHKEY_WORKER_BIN,
                                           "--coordinator",
                                           address_,
                                           "--job",
                                           job_id_,
                                           "--advertise-host",
                                           ip,
                                           "--metrics-jsonl",
                                           absl::StrCat(dir_, "/steps-", r, ".jsonl"),
                                           "--save",
                                           dir_ + "/final",
                                           "--collective-timeout-seconds",
                                           std::to_string(o_.collective_timeout_s),
                                           "--quiet",
                                           "--log-steps"};
    std::vector<std::string> full = argv;
    full.insert(full.end(), o_.worker_flags.begin(), o_.worker_flags.end());
    cluster_->StartSupervised(host, full, env, WorkerLog(r),
                              absl::StrCat(dir_, "/worker-", r, ".pid"));
  }
  return absl::OkStatus();
}

absl::Status ClusterJob::StartCoordinator() {
  std::filesystem::remove(dir_ + "/ports.json");
  coordinator_pid_ =
      cluster_->Start(kCoordinatorHost, coordinator_argv_, {},
                      absl::StrCat(dir_, "/coordinator-", coordinator_starts_++, ".log"));
  const std::string ports = WaitForFile(
      dir_ + "/ports.json", [](const std::string& t) { return !t.empty(); },
      std::chrono::seconds(30));
  if (ports.empty())
    return absl::UnavailableError("coordinator did not start: " + CoordinatorLog());
  return absl::OkStatus();
}

absl::Status ClusterJob::RestartCoordinator() {
  // The process sim_hosts.sh exec'd into is the coordinator itself (exec all the way down).
  kill(coordinator_pid_, SIGKILL);
  WaitProcess(coordinator_pid_, std::chrono::seconds(10));
  return StartCoordinator();
}

std::optional<nlohmann::json> ClusterJob::Status() {
  int code = 0;
  const std::string out = Cli({"--json", "status", job_id_}, &code);
  if (code != 0) return std::nullopt;
  try {
    nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{')));
    // "JOB_STATE_SUCCEEDED" -> "SUCCEEDED"
    std::string state = j.value("state", "");
    if (state.rfind("JOB_STATE_", 0) == 0) j["state"] = state.substr(10);
    return j;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<nlohmann::json> ClusterJob::WaitEnded(std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::optional<nlohmann::json> last;
  while (std::chrono::steady_clock::now() < until) {
    if (auto s = Status(); s.has_value()) {
      last = s;
      const std::string state = s->value("state", "");
      if (state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED") return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return std::nullopt;
}

bool ClusterJob::WaitStep(int64_t step, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  const int world = o_.worker_hosts * o_.ranks_per_host;
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (int r = 0; r < world && all; ++r) {
      const auto records = StepRecords(absl::StrCat(dir_, "/steps-", r, ".jsonl"));
      all = !records.empty() && records.back()["step"].get<int64_t>() >= step;
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

std::map<int64_t, double> ClusterJob::Losses() const {
  std::map<int64_t, double> out;
  for (const auto& r : StepRecords(dir_ + "/steps-0.jsonl")) {
    out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  }
  return out;
}

std::map<int64_t, int> ClusterJob::StepRuns() const {
  std::map<int64_t, int> out;
  for (const auto& r : StepRecords(dir_ + "/steps-0.jsonl")) ++out[r["step"].get<int64_t>()];
  return out;
}

std::string ClusterJob::CoordinatorLog() const {
  std::string out;
  for (int i = 0; i < coordinator_starts_; ++i) {
    out += ReadText(absl::StrCat(dir_, "/coordinator-", i, ".log"));
  }
  return out;
}
std::string ClusterJob::WorkerLog(int rank) const {
  return absl::StrCat(dir_, "/worker-", rank, ".log");
}

int ClusterJob::WorkerPid(int rank) const {
  const std::string text = ReadPid(absl::StrCat(dir_, "/worker-", rank, ".pid"));
  return text.empty() ? -1 : std::stoi(text);
}

SpecParams ClusterSpecParams(int steps, int seed, int data_seed) {
  ModelShape model;
  model.n_embd = 64;
  model.n_positions = 32;
  SpecParams p;
  p.model = ModelJson(model);
  p.micro_batch = 2;
  p.gas = 2;
  p.zero_stage = 1;
  p.optimizer = "AdamW";
  p.lr = 3e-3;
  p.tp = 2;
  p.seq_len = 32;
  p.steps = steps;
  p.seed = seed;
  p.world_size = 4;
  p.data = SyntheticData(data_seed);
  return p;
}

std::vector<char> FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace latchkey::testing
