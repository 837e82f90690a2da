// `latchkey up`: the local launcher. Starts an embedded coordinator (its SQLite file in the run
// folder), submits the job, starts one latchkey-worker process per rank on this machine (Gloo on
// CPU), shows live progress, prints where the metrics endpoints are, and ends with a summary
// table from the ranks' per-step JSONL. Ctrl-C cancels the job and stops everything it started.
// While the job runs, a supervisor (up_supervisor.cc) starts a dead worker again with the same
// rank and reports its death, kills a worker the coordinator declared stalled, and starts a dead
// coordinator again on the same ports and database; the job recovers from its last checkpoint
// up to latchkey.max_restarts (--max-restarts) times, then fails naming the cause, and `up`
// exits non-zero.
// Auth is on, as on any coordinator: `up` makes an admin token (32 random bytes, hex), starts its
// coordinator with --auth-tokens <run>/auth-tokens (the token's SHA-256 only), keeps the token in
// <run>/credentials.json and in the user's credentials file under the coordinator's address
// (client/credentials.h; all mode 0600), so `latchkey --coordinator ADDR status JOB` works
// against it. Workers get their join token in the environment, never on the command line.
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
#include <cstdlib>
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
#include "client/cli/up.h"
#include "client/credentials.h"
#include "common/cli_checks.h"
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
  int max_restarts = -1;  // >= 0: replaces the spec's latchkey.max_restarts
  bool tls = false;       // a self-signed CA and certificate (openssl CLI); TLS everywhere
};

// The spec with latchkey.max_restarts set (text that is not a JSON object is left to the
// spec's own validation).
std::string WithMaxRestarts(const std::string& text, int max_restarts) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return text;
  if (!j.contains("latchkey") || !j["latchkey"].is_object())
    j["latchkey"] = nlohmann::json::object();
  j["latchkey"]["max_restarts"] = max_restarts;
  return j.dump(2) + "\n";
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

// A CA and a certificate for 127.0.0.1/localhost signed by it, made with the openssl CLI in
// RUN/tls (keys mode 0600). The coordinator serves server.pem; every client checks ca.pem.
absl::Status MakeLocalCertificates(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError("--tls: cannot create " + dir + ": " + ec.message());
  const std::string script =
      "set -e; umask 077; cd '" + dir +
      "'; "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 "
      "-subj /CN=latchkey-up-ca; "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost; "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
      "-days 30 -extfile server.ext";
  const std::string cmd = "sh -c \"" + script + "\" > '" + dir + "/openssl.log' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    return absl::FailedPreconditionError("--tls: openssl could not make a certificate; see " + dir +
                                         "/openssl.log");
  }
  return absl::OkStatus();
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
  std::string spec_text = built_in ? std::string(kBuiltInJobSpec) : ReadTextFile(o.spec);
  if (o.max_restarts >= 0) spec_text = WithMaxRestarts(spec_text, o.max_restarts);
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

  // The admin token of this run's coordinator: only its hash goes into --auth-tokens.
  const absl::StatusOr<std::string> admin_token = RandomHexToken(32);
  if (!admin_token.ok()) return Fail(admin_token.status());
  if (absl::Status st = WritePrivateFile(
          run + "/auth-tokens", "# written by latchkey up: ROLE NAME SHA256HEX\nadmin up " +
                                    Sha256Hex(*admin_token) + "\n");
      !st.ok()) {
    return Fail(st);
  }

  const std::string coord_log = run + "/coordinator.log";
  // A run folder can be reused (the database keeps earlier jobs): never read a stale port file,
  // and start each job's per-step JSONL afresh (a restarted worker of this job appends to it).
  fs::remove(run + "/ports.json");
  for (int r = 0; r < world; ++r) {
    fs::remove(run + "/worker-" + std::to_string(r) + ".port.json");
    fs::remove(run + "/steps-" + std::to_string(r) + ".jsonl");
  }
  const std::string tls_dir = run + "/tls";
  if (o.tls) {
    if (absl::Status st = MakeLocalCertificates(tls_dir); !st.ok()) return Fail(st);
  }
  SpawnOptions coordinator;
  const auto coordinator_args = [&](const std::string& listen, const std::string& metrics_port) {
    std::vector<std::string> args{FindBinary("latchkey-coordinator", "server"), "--listen", listen,
                                  "--db", run + "/coordinator.db", "--metrics-host", "127.0.0.1",
                                  "--metrics-port", metrics_port, "--port-file",
                                  run + "/ports.json", "--auth-tokens", run + "/auth-tokens",
                                  "--liveness-timeout", std::to_string(o.liveness_s),
                                  // Positions (and stall verdicts) every second.
                                  "--heartbeat-interval", "1"};
    if (o.tls) {
      args.insert(args.end(),
                  {"--tls-cert", tls_dir + "/server.pem", "--tls-key", tls_dir + "/server.key"});
    }
    return args;
  };
  coordinator.args = coordinator_args("127.0.0.1:0", "0");
  coordinator.log_path = coord_log;
  const absl::StatusOr<pid_t> started = Spawn(coordinator);
  if (!started.ok()) return Fail(started.status());
  const pid_t coord = *started;
  nlohmann::json ports;
  for (int i = 0; i < 200 && ports.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto parsed = nlohmann::json::parse(ReadTextFile(run + "/ports.json"), nullptr, false);
    if (!parsed.is_discarded() && parsed.contains("grpc_port")) ports = parsed;
  }
  if (ports.is_null()) {
    StopAll({coord}, std::chrono::seconds(2));
    return Fail(absl::UnavailableError("coordinator did not start; see " + coord_log));
  }
  const int grpc_port = ports["grpc_port"].get<int>();
  const int metrics_port = ports.value("metrics_port", 0);
  CliContext ctx = ctx_in;
  ctx.coordinator = "127.0.0.1:" + std::to_string(grpc_port);
  // Its own coordinator, plaintext on loopback, with the token made above (not the user's).
  ctx.credentials = ChannelCredentials{};
  ctx.credentials.token = *admin_token;
  const std::string tls_ca = o.tls ? tls_dir + "/ca.pem" : "";
  ctx.credentials.tls_ca = tls_ca;
  {
    nlohmann::json entry = {{ctx.coordinator, {{"token", *admin_token}}}};
    if (o.tls) entry[ctx.coordinator]["tls_ca"] = tls_ca;
    if (absl::Status st = WritePrivateFile(run + "/credentials.json", entry.dump(2) + "\n");
        !st.ok()) {
      StopAll({coord}, std::chrono::seconds(2));
      return Fail(st);
    }
    const std::string user_file =
        ctx.credentials_file.empty() ? DefaultCredentialsPath() : ctx.credentials_file;
    if (absl::Status st = SaveCredentials(user_file, ctx.coordinator, {*admin_token, tls_ca});
        !st.ok()) {
      std::fprintf(stderr, "latchkey up: warning: %s (the token is in %s/credentials.json)\n",
                   std::string(st.message()).c_str(), run.c_str());
    }
  }
  // The watch waits out a restart of the coordinator.
  ctx.watch_reconnect_s = 60;
  // Under --tls the coordinator's HTTP port serves HTTPS with the same certificate.
  std::printf("coordinator  %s  (metrics %s://127.0.0.1:%d/metrics, db %s/coordinator.db)\n",
              ctx.coordinator.c_str(), o.tls ? "https" : "http", metrics_port, run.c_str());
  std::printf("auth         admin token in %s/credentials.json (and the credentials file)\n",
              run.c_str());

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
    StopAll({coord}, std::chrono::seconds(2));
    return Fail(submitted.status());
  }
  const std::string job = submitted->job_id;
  std::printf("job          %s  (%d workers, run folder %s)\n", job.c_str(), world, run.c_str());
  std::fflush(stdout);

  SupervisorConfig sc;
  sc.client = ctx.client_options();
  sc.job_id = job;
  sc.join_token = submitted->join_token;
  sc.run_dir = run;
  sc.world = world;
  sc.live_progress = LiveProgress(ctx);
  sc.coordinator_pid = coord;
  // Started again on the ports it had, so workers and the watch find it where it was.
  sc.coordinator.args = coordinator_args(ctx.coordinator, std::to_string(metrics_port));
  sc.coordinator.log_path = coord_log;
  sc.worker = [&, token = submitted->join_token](int r) {
    SpawnOptions worker;
    worker.args = {FindBinary("latchkey-worker", "worker"),
                   "--coordinator",
                   ctx.coordinator,
                   "--job",
                   job,
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
    // The join token in the environment (not visible in `ps`); this coordinator's CA (or
    // plaintext), whatever TLS settings the user's environment holds.
    // LOCAL_RANK: every rank runs on this machine (latchkey.device "cuda" uses cuda:LOCAL_RANK).
    worker.extra_env = {"RANK=" + std::to_string(r),
                        "LOCAL_RANK=" + std::to_string(r),
                        "LOCAL_WORLD_SIZE=" + std::to_string(world),
                        "LATCHKEY_JOIN_TOKEN=" + token,
                        "LATCHKEY_TLS_CA=" + tls_ca,
                        "LATCHKEY_TLS_CERT=",
                        "LATCHKEY_TLS_KEY="};
    worker.log_path = run + "/worker-" + std::to_string(r) + ".log";
    return worker;
  };
  UpSupervisor supervisor(sc);
  if (absl::Status st = supervisor.Start(); !st.ok()) {
    (void)client.CancelJob(job, "latchkey up could not start its workers");
    supervisor.Stop();
    std::vector<pid_t> all = supervisor.WorkerPids();
    StopAll(all, std::chrono::seconds(5));
    StopAll({supervisor.CoordinatorPid()}, std::chrono::seconds(5));
    return Fail(st);
  }
  std::atomic<bool> interrupted{false};
  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) return;
    interrupted = true;
    std::fprintf(stderr, "\nlatchkey up: interrupted, cancelling job %s\n", job.c_str());
    (void)client.CancelJob(job, "interrupted by latchkey up");
    supervisor.Stop();
    std::vector<pid_t> all = supervisor.WorkerPids();
    all.push_back(supervisor.CoordinatorPid());
    StopAll(all, std::chrono::seconds(5));
  });
  // Where the metrics are: each worker writes its port file once it has formed its groups and
  // serves its metrics (up to a minute: the ranks meet and build their model first).
  supervisor.WaitFirstAnnounced();
  JobInfo last_job;
  bool have_job = false;
  WatchHooks hooks;
  hooks.on_job = [&](const JobInfo& j) {
    have_job = true;
    supervisor.OnJob(j);
  };
  hooks.last_job = &last_job;
  int code = WatchUntilEnd(ctx, job, o.max_seconds, hooks);
  if (interrupted) code = kJobCancelled;
  if (!have_job || !IsTerminal(last_job.state)) {
    if (auto j = client.GetJob(job); j.ok()) {
      last_job = *j;
      have_job = true;
    }
  }
  // Workers leave on their own once the job ended; then the coordinator goes.
  supervisor.Stop();
  StopAll(supervisor.WorkerPids(), std::chrono::seconds(5),
          std::chrono::seconds(o.collective_timeout_s + 5));
  StopAll({supervisor.CoordinatorPid()}, std::chrono::seconds(10));
  if (!interrupted) {
    pthread_kill(signals.native_handle(), SIGUSR1);
  }
  signals.join();
  PrintUpSummary(run + "/steps-0.jsonl", have_job ? &last_job : nullptr,
                 supervisor.worker_restarts(), supervisor.coordinator_restarts());
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
      "up", "Run a job locally: embedded coordinator + one worker process per rank");
  up->add_option("--spec", opts->spec,
                 "job spec JSON (default: the built-in job: the demo model on synthetic data)");
  up->add_option("--run-dir", opts->run_dir, "folder for the database, logs, JSONL, weights");
  up->add_option("--workers", opts->workers, "worker processes (default: the spec's world size)")
      ->check(Positive());
  up->add_option("--max-restarts", opts->max_restarts,
                 "recoveries before the job fails (replaces the spec's latchkey.max_restarts)")
      ->check(NonNegative());
  up->add_flag("--tls", opts->tls,
               "TLS on its coordinator's gRPC port: a CA and certificate made with openssl in "
               "RUN/tls, trusted by its workers and (through the credentials file) the CLI");
  up->add_option("--liveness-timeout", opts->liveness_s,
                 "seconds without a heartbeat before a worker counts as lost")
      ->check(Positive())
      ->capture_default_str();
  up->add_option("--collective-timeout", opts->collective_timeout_s,
                 "seconds a collective may block before a worker gives up")
      ->check(Positive())
      ->capture_default_str();
  up->callback([&ctx, opts, exit_code] { *exit_code = RunUp(ctx, *opts); });
}

}  // namespace latchkey::cli
