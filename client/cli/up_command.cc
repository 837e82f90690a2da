// `latchkey up`: the local launcher. Starts an embedded coordinator (its SQLite file in the run
// folder), submits the job, starts one latchkey-worker process per rank on this machine (Gloo on
// CPU), shows live progress, prints where the metrics endpoints are, and ends with a summary
// table from the ranks' per-step JSONL. Ctrl-C cancels the job and stops everything it started.
// A crashed worker fails the job (the coordinator names the rank) and `up` exits non-zero.
// Without --spec it runs the built-in job (builtin_spec.h), which reads no files, and keeps that
// spec as <run>/spec.json to edit and pass back with --spec.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "client/cli/builtin_spec.h"
#include "client/cli/cli.h"
#include "common/job_spec.h"
#include "common/subprocess.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

struct UpOptions {
  std::string spec;     // empty: the built-in job
  std::string run_dir;  // default runs/up-<unix time>
  int workers = 0;      // 0 = the spec's world size
  // Tighter than the coordinator's and worker's defaults (common/timeouts.h): every process is on
  // this machine, so a silent or stuck rank is a crash, and the user is watching.
  double liveness_s = 10;
  int collective_timeout_s = 30;
  double max_seconds = 24 * 3600;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The build tree puts the binaries at build/{client,server,worker}/; an install puts them on
// PATH. Prefer siblings of this executable's folder, then PATH.
std::string FindBinary(const std::string& name, const std::string& subdir) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const fs::path& p :
       {self.parent_path() / name, self.parent_path().parent_path() / subdir / name}) {
    if (fs::exists(p)) return p.string();
  }
  return name;  // PATH lookup by posix_spawnp
}

int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;  // 0: let the coordinator choose
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void PrintSummary(const std::string& jsonl) {
  // A restarted rank appends to its JSONL: the last record of a step is the one that counts.
  std::map<int64_t, nlohmann::json> by_step;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step")) by_step[row["step"].get<int64_t>()] = row;
  }
  std::vector<nlohmann::json> rows;
  for (auto& [step, row] : by_step) rows.push_back(std::move(row));
  if (rows.empty()) return;
  std::vector<double> secs;
  std::map<std::string, std::pair<int64_t, int64_t>> kv;  // mode -> (calls, steps)
  std::map<std::string, int64_t> calls;
  int64_t tokens = 0;
  for (const auto& r : rows) {
    secs.push_back(r["step_seconds"].get<double>());
    auto& k = kv[r["kv_mode"].get<std::string>()];
    k.first += r["kv_allreduce_calls"].get<int64_t>();
    k.second += 1;
    for (auto it = r["collective_calls"].begin(); it != r["collective_calls"].end(); ++it) {
      calls[it.key()] += it.value().get<int64_t>();
    }
    tokens += r["tokens"].get<int64_t>();
  }
  const double median = Median(secs);
  std::printf("\nsummary (rank 0)\n");
  std::printf("  %-36s %zu\n", "steps", rows.size());
  std::printf("  %-36s %.4f -> %.4f\n", "loss first -> final", rows.front()["loss"].get<double>(),
              rows.back()["loss"].get<double>());
  // Evaluation (latchkey.eval) and the learning rate schedule, from the steps that carry them.
  std::vector<std::pair<int64_t, double>> evals;  // step, eval_loss
  std::vector<double> lrs;
  for (const auto& r : rows) {
    if (r.contains("eval_loss") && r["eval_loss"].is_number()) {
      evals.emplace_back(r["step"].get<int64_t>(), r["eval_loss"].get<double>());
    }
    if (r.contains("lr") && r["lr"].is_number()) lrs.push_back(r["lr"].get<double>());
  }
  if (!evals.empty()) {
    std::printf("  %-36s %.4f -> %.4f  (%zu evaluations, steps %lld .. %lld)\n",
                "eval loss first -> final", evals.front().second, evals.back().second, evals.size(),
                static_cast<long long>(evals.front().first),
                static_cast<long long>(evals.back().first));
  }
  if (!lrs.empty()) {
    const auto [lo, hi] = std::minmax_element(lrs.begin(), lrs.end());
    std::printf("  %-36s %.3e .. %.3e  (first %.3e, final %.3e)\n", "lr min .. max", *lo, *hi,
                lrs.front(), lrs.back());
  }
  for (const auto& [mode, k] : kv) {
    std::printf("  %-36s %.1f  (%lld steps)\n", ("K/V all-reduces/step, " + mode).c_str(),
                static_cast<double>(k.first) / k.second, static_cast<long long>(k.second));
  }
  for (const auto& [key, n] : calls) {
    std::printf("  %-36s %.1f\n", ("collectives/step " + key).c_str(),
                static_cast<double>(n) / rows.size());
  }
  std::printf("  %-36s %.3f s\n", "median step time", median);
  std::printf("  %-36s %.0f\n", "tokens/s (median step)",
              rows.back()["tokens"].get<double>() / std::max(median, 1e-9));
}

int RunUp(const CliContext& ctx_in, const UpOptions& o) {
  // Signals go to one thread (sigwait) so Ctrl-C can stop the children from anywhere.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);  // our own wake-up of the signal thread at the end
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const bool built_in = o.spec.empty();
  if (!built_in && !std::ifstream(o.spec)) {
    return Fail(absl::InvalidArgumentError("--spec: cannot read '" + o.spec + "'"));
  }
  const std::string spec_text = built_in ? std::string(kBuiltInJobSpec) : ReadFile(o.spec);
  // Validated here too, so a bad spec fails before anything is started (naming the field).
  const std::string base_dir =
      built_in ? fs::current_path().string() : fs::absolute(o.spec).parent_path().string();
  const absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_text, base_dir);
  if (!spec.ok()) {
    return Fail(
        absl::Status(spec.status().code(), (built_in ? std::string() : "--spec " + o.spec + ": ") +
                                               std::string(spec.status().message())));
  }
  const int world = o.workers > 0 ? o.workers : spec->world_size;
  const std::string run =
      fs::absolute(o.run_dir.empty() ? "runs/up-" + std::to_string(std::time(nullptr)) : o.run_dir)
          .string();
  std::error_code mkdir_error;
  fs::create_directories(run, mkdir_error);
  if (mkdir_error) {
    return Fail(absl::PermissionDeniedError("--run-dir: cannot create '" + run +
                                            "': " + mkdir_error.message()));
  }
  if (built_in) {
    std::ofstream(run + "/spec.json") << spec_text;
    std::printf(
        "spec         built-in job (demo model, synthetic data, %lld steps; %s/spec.json, "
        "or pass --spec FILE)\n",
        static_cast<long long>(spec->steps), run.c_str());
  }

  std::vector<pid_t> children;
  const std::string coord_log = run + "/coordinator.log";
  // A run folder can be reused (the database keeps earlier jobs): never read a stale port file.
  fs::remove(run + "/ports.json");
  for (int r = 0; r < world; ++r) fs::remove(run + "/worker-" + std::to_string(r) + ".port.json");
  SpawnOptions coordinator;
  coordinator.args = {FindBinary("latchkey-coordinator", "server"),
                      "--listen",
                      "127.0.0.1:0",
                      "--db",
                      run + "/coordinator.db",
                      "--metrics-host",
                      "127.0.0.1",
                      "--metrics-port",
                      "0",
                      "--port-file",
                      run + "/ports.json",
                      "--liveness-timeout",
                      std::to_string(o.liveness_s),
                      "--heartbeat-interval",
                      std::to_string(std::max(0.5, o.liveness_s / 5))};
  coordinator.log_path = coord_log;
  const absl::StatusOr<pid_t> started = Spawn(coordinator);
  if (!started.ok()) return Fail(started.status());
  const pid_t coord = *started;
  children.push_back(coord);
  nlohmann::json ports;
  for (int i = 0; i < 200 && ports.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto parsed = nlohmann::json::parse(ReadFile(run + "/ports.json"), nullptr, false);
    if (!parsed.is_discarded() && parsed.contains("grpc_port")) ports = parsed;
  }
  if (ports.is_null()) {
    StopAll(children, std::chrono::seconds(2));
    return Fail(absl::UnavailableError("coordinator did not start; see " + coord_log));
  }
  CliContext ctx = ctx_in;
  ctx.coordinator = "127.0.0.1:" + std::to_string(ports["grpc_port"].get<int>());
  std::printf("coordinator  %s  (metrics http://127.0.0.1:%d/metrics, db %s/coordinator.db)\n",
              ctx.coordinator.c_str(), ports.value("metrics_port", 0), run.c_str());

  JobClient client(ctx.client_options());
  JobSubmission submission;
  submission.spec_json = spec_text;
  // The built-in spec names no files; a spec file's relative paths resolve against its folder.
  submission.base_dir = built_in ? run : fs::absolute(o.spec).parent_path().string();
  submission.rendezvous_host = "127.0.0.1";
  // A port free right now on this machine, rather than the coordinator's range, which other
  // local coordinators (other `up` runs) hand out too.
  submission.rendezvous_port = FreeLocalPort();
  auto submitted = client.SubmitJob(submission);
  if (!submitted.ok()) {
    StopAll(children, std::chrono::seconds(2));
    return Fail(submitted.status());
  }
  const std::string job = submitted->job_id;
  std::printf("job          %s  (%d workers, run folder %s)\n", job.c_str(), world, run.c_str());

  std::vector<pid_t> workers;
  for (int r = 0; r < world; ++r) {
    SpawnOptions worker;
    worker.args = {FindBinary("latchkey-worker", "worker"),
                   "--coordinator",
                   ctx.coordinator,
                   "--job",
                   job,
                   "--join-token",
                   submitted->join_token,
                   "--metrics-host",
                   "127.0.0.1",
                   "--metrics-port",
                   "0",
                   "--metrics-jsonl",
                   run + "/steps-{rank}.jsonl",
                   "--port-file",
                   run + "/worker-{rank}.port.json",
                   "--save",
                   run + "/final",
                   "--collective-timeout-seconds",
                   std::to_string(o.collective_timeout_s),
                   "--quiet"};
    worker.extra_env = {"RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world)};
    worker.log_path = run + "/worker-" + std::to_string(r) + ".log";
    const absl::StatusOr<pid_t> p = Spawn(worker);
    if (!p.ok()) {
      (void)client.CancelJob(job, "latchkey up could not start worker " + std::to_string(r));
      StopAll(children, std::chrono::seconds(5));
      return Fail(p.status());
    }
    workers.push_back(*p);
    children.push_back(*p);
  }
  // Where the metrics are: each worker writes its port file once it has formed its groups and
  // serves its metrics (up to a minute: the ranks meet and build their model first).
  for (int r = 0; r < world; ++r) {
    const std::string port_file = run + "/worker-" + std::to_string(r) + ".port.json";
    nlohmann::json info;
    for (int i = 0; i < 1200 && !info.is_object(); ++i) {
      info = nlohmann::json::parse(ReadFile(port_file), nullptr, /*allow_exceptions=*/false);
      if (!info.is_object()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (info.is_object() && info.value("metrics_port", -1) > 0) {
      std::printf("worker %d     pid %d  metrics http://%s:%d/metrics  (log %s/worker-%d.log)\n", r,
                  static_cast<int>(workers[r]),
                  info.value("metrics_host", std::string("127.0.0.1")).c_str(),
                  info.value("metrics_port", -1), run.c_str(), r);
    }
  }
  std::fflush(stdout);

  std::atomic<bool> interrupted{false};
  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) return;
    interrupted = true;
    std::fprintf(stderr, "\nlatchkey up: interrupted, cancelling job %s\n", job.c_str());
    (void)client.CancelJob(job, "interrupted by latchkey up");
    StopAll(children, std::chrono::seconds(5));
  });
  int code = WatchUntilEnd(ctx, job, o.max_seconds);
  if (interrupted) code = kJobCancelled;
  // Workers leave on their own once the job ended; then the coordinator goes.
  StopAll(workers, std::chrono::seconds(5), std::chrono::seconds(o.collective_timeout_s + 5));
  StopAll({coord}, std::chrono::seconds(10));
  if (!interrupted) {
    pthread_kill(signals.native_handle(), SIGUSR1);
  }
  signals.join();
  PrintSummary(run + "/steps-0.jsonl");
  if (code == kOk) {
    std::printf("weights      %s/final (HF GPTBigCode checkpoint)\n", run.c_str());
  } else {
    std::fprintf(stderr, "latchkey up: job %s did not succeed (exit %d); logs in %s\n", job.c_str(),
                 code, run.c_str());
  }
  return code;
}

}  // namespace

void AddUpCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto opts = std::make_shared<UpOptions>();
  CLI::App* up = app.add_subcommand(
      "up", "Run a job locally: embedded coordinator + one worker process per rank (Gloo, CPU)");
  up->add_option("--spec", opts->spec,
                 "job spec JSON (default: the built-in job: the demo model on synthetic data)");
  up->add_option("--run-dir", opts->run_dir, "folder for the database, logs, JSONL, weights");
  up->add_option("--workers", opts->workers, "worker processes (default: the spec's world size)");
  up->add_option("--liveness-timeout", opts->liveness_s,
                 "seconds without a heartbeat before a worker fails the job")
      ->capture_default_str();
  up->add_option("--collective-timeout", opts->collective_timeout_s,
                 "seconds a collective may block before a worker gives up")
      ->capture_default_str();
  up->callback([&ctx, opts, exit_code] { *exit_code = RunUp(ctx, *opts); });
}

}  // namespace latchkey::cli
