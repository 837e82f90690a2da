// End to end: a real coordinator process, real worker processes (Gloo, TP 2) and the CLI.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/free_port.h"
#include "tests/support/launch.h"
#include "tests/support/metrics_scrape.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string NewDir(const std::string& name) { return MakeTempDir("e2e-" + name); }

size_t Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// Field by proto name or its JSON (lowerCamel) name.
nlohmann::json Field(const nlohmann::json& j, const std::string& proto, const std::string& camel) {
  if (j.contains(proto)) return j[proto];
  if (j.contains(camel)) return j[camel];
  return nullptr;
}

// A model big enough that a step takes a visible fraction of a second on 2 cores, so a policy
// update lands mid-job.
nlohmann::json E2eSpec(int steps, const std::string& kv) {
  ModelShape model;
  model.n_embd = 192;
  model.n_positions = 128;
  SpecParams p;
  p.model = ModelJson(model);
  p.gas = 4;
  p.zero_stage = std::nullopt;
  p.optimizer = "SGD";
  p.lr = 0.1;
  p.tp = 2;
  p.managed = std::nullopt;
  p.seq_len = 128;
  p.steps = steps;
  p.seed = 3;
  p.world_size = 2;
  p.kv_reduce = kv;
  p.data = SyntheticData(5);
  return SpecObject(p);
}

// The coordinator (tests/support/coordinator_process.h) with its metrics port on a free port,
// and the CLI pointed at it.
class Coordinator {
 public:
  explicit Coordinator(const std::string& dir, const std::string& liveness_s = "10")
      : c_(LATCHKEY_COORDINATOR_BIN, dir,
           InRunDir(dir, {"--latch-lookahead", "2", "--liveness-timeout", liveness_s})) {}
  std::string address() const { return c_.ok() ? c_.address() : ""; }
  Captured Cli(std::vector<std::string> args) const {
    args.insert(args.begin(), {LATCHKEY_CLI_BIN, "--coordinator", address()});
    return RunAndCapture(args, seconds(120));
  }

 private:
  ScopedCoordinator c_;
};

TEST(EndToEnd, PolicyUpdateMidJobAndMetrics) {
  const std::string dir = NewDir("update");
  // Enough steps that the update (a CLI process started once two steps are in) lands while
  // windows are still unpublished, however fast the steps run.
  const int steps = 40;
  std::ofstream(dir + "/spec.json") << E2eSpec(steps, "deferred").dump(2);
  Coordinator coord(dir);
  ASSERT_FALSE(coord.address().empty()) << ReadText(dir + "/coordinator.log");

  Captured sub = coord.Cli(
      {"--json", "submit", dir + "/spec.json", "--rendezvous-port", std::to_string(FreePort())});
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const auto submitted = nlohmann::json::parse(sub.output.substr(sub.output.find('{')));
  const std::string job = Field(submitted, "job_id", "jobId");
  const std::string token = Field(submitted, "join_token", "joinToken");

  std::vector<int> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(StartProcess(
        {WorkerBinary(), "--coordinator", coord.address(), "--job", job, "--join-token", token,
         "--metrics-jsonl", dir + "/steps-{rank}.jsonl", "--metrics-port", "0", "--metrics-host",
         "127.0.0.1", "--linger-seconds", "60", "--quiet"},
        {"RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2"},
        dir + "/worker-" + std::to_string(r) + ".log"));
  }
  // Mid-job: once two steps are in, switch to per_micro_batch.
  WaitForFile(
      dir + "/steps-0.jsonl", [](const std::string& t) { return Lines(t) >= 2; }, seconds(120));
  Captured upd = coord.Cli({"--json", "update", job, "--kv-reduce", "per_micro_batch"});
  ASSERT_EQ(upd.exit_code, 0) << upd.output;
  const auto updated = nlohmann::json::parse(upd.output.substr(upd.output.find('{')));
  // Proto JSON writes int64 as a string.
  const nlohmann::json fw = Field(updated, "first_window", "firstWindow");
  const int64_t from = fw.is_string()   ? std::stoll(fw.get<std::string>())
                       : fw.is_number() ? fw.get<int64_t>()
                                        : -1;
  ASSERT_GT(from, 1) << upd.output;
  ASSERT_LT(from, steps) << upd.output;

  Captured watch = coord.Cli({"watch", job});
  EXPECT_EQ(watch.exit_code, 0) << watch.output;  // SUCCEEDED

  // Per-step K/V all-reduces: 2L = 4 (deferred) before the update's window, 2L*GAS = 16 from it.
  std::vector<std::vector<nlohmann::json>> rows = {StepRecords(dir + "/steps-0.jsonl"),
                                                   StepRecords(dir + "/steps-1.jsonl")};
  for (const auto& rank : rows) {
    ASSERT_EQ(rank.size(), static_cast<size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      const bool after = s >= from;
      EXPECT_EQ(rank[s]["kv_mode"], after ? "per_micro_batch" : "deferred") << "step " << s;
      EXPECT_EQ(rank[s]["kv_allreduce_calls"].get<int64_t>(), after ? 16 : 4) << "step " << s;
    }
  }
  // The worker's endpoint agrees with the per-step counts.
  const std::string log0 = ReadText(dir + "/worker-0.log");
  const int port = RankMetricsPort(log0, 0);
  ASSERT_GT(port, 0) << log0;
  const std::string text = ScrapeMetrics(port);
  ASSERT_FALSE(text.empty());
  double total = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("latchkey_kv_allreduce_total{", 0) == 0) {
      total += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  double jsonl_total = 0;
  for (const auto& row : rows[0]) jsonl_total += row["kv_allreduce_calls"].get<double>();
  EXPECT_EQ(total, jsonl_total);
  for (int pid : workers) {
    kill(pid, SIGTERM);
    WaitProcess(pid, seconds(10));
  }

  // The same spec standalone: the K/V mode changes the number of collectives, not the numbers.
  // The two runs sum the K/V gradient in float32 in different orders (per micro-batch from the
  // update on, deferred throughout), which drifts apart slowly: the first 10 steps stay within
  // 1e-6 (beyond ~25 steps the drift exceeds it).
  WorkerRun standalone = RunWorkers(E2eSpec(steps, "deferred"), 2);
  ASSERT_TRUE(standalone.ok()) << standalone.Describe();
  for (int s = 0; s < 10; ++s) {
    EXPECT_NEAR(rows[0][s]["loss"].get<double>(), standalone.steps[0][s]["loss"].get<double>(),
                1e-6)
        << "step " << s;
  }
}

// Bare `latchkey up` (no --spec) in a fresh checkout or anywhere else: it runs its built-in job,
// which reads no files, from any working directory.
TEST(EndToEnd, BareUpRunsTheBuiltInJobFromAnEmptyFolder) {
  const std::string dir = NewDir("bare-up");
  const std::string cwd = dir + "/empty";
  std::filesystem::create_directories(cwd);
  // The shell only changes the working directory; `latchkey up` is exec'd in its place.
  const int up = StartProcess({"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" up --run-dir \"$2\"", cwd,
                               LATCHKEY_CLI_BIN, dir + "/run"},
                              {}, dir + "/up.log");
  const int code = WaitProcess(up, seconds(300));
  const std::string log = ReadText(dir + "/up.log");
  ASSERT_EQ(code, 0) << log;

  // The built-in job: the demo model (TP 2, two workers) for 40 steps on seeded synthetic data.
  constexpr int kSteps = 40;
  for (int r = 0; r < 2; ++r) {
    const auto rows = StepRecords(dir + "/run/steps-" + std::to_string(r) + ".jsonl");
    ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps)) << "rank " << r << "\n" << log;
    for (int s = 0; s < kSteps; ++s) EXPECT_EQ(rows[s]["step"].get<int>(), s) << "rank " << r;
    // It trains: the synthetic sequences are learnable, so the loss falls well below its start.
    EXPECT_LT(rows.back()["loss"].get<double>(), 0.5 * rows.front()["loss"].get<double>())
        << "rank " << r;
  }
  EXPECT_TRUE(std::regex_search(log, std::regex("step 40/40[^\n]* succeeded"))) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  steps +40\n"))) << log;
  // Its warmup + cosine schedule starts at lr 0; it has no eval file, so no eval loss.
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  lr min \\.\\. max +0\\.000e\\+00 \\.\\. ")))
      << log;
  EXPECT_EQ(log.find(" eval "), std::string::npos) << log;
  EXPECT_EQ(log.find("eval loss"), std::string::npos) << log;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/final/model.safetensors")) << log;
  // The spec it ran is kept beside the outputs, ready to edit and pass back with --spec.
  const auto spec = nlohmann::json::parse(ReadText(dir + "/run/spec.json"), nullptr, false);
  ASSERT_FALSE(spec.is_discarded()) << log;
  EXPECT_EQ(spec["latchkey"]["steps"], kSteps);
  // With --run-dir, nothing lands in the working directory.
  EXPECT_TRUE(std::filesystem::is_empty(cwd));
}

// `latchkey up` on a spec with a warmup + cosine schedule and a held-out eval file: every step's
// lr in the JSONL, the eval loss on exactly the evaluated steps, both through the coordinator
// into the progress lines, and the summary's eval loss first -> final and lr range.
TEST(EndToEnd, UpShowsTheLrScheduleAndTheEvalLoss) {
  const std::string dir = NewDir("up-eval");
  constexpr int kSteps = 12;
  constexpr int kSeqLen = 32;
  constexpr double kLr = 3e-3;
  {
    // The held-out tokens: 4 samples of a fixed byte pattern, unlike the synthetic training data.
    std::vector<uint16_t> tokens(4 * kSeqLen + 1);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<uint16_t>((i * 37 + i / 5) % 256);
    std::ofstream(dir + "/eval.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  }
  SpecParams p;
  p.gas = 2;
  p.zero_stage = 0;
  p.lr = kLr;
  p.tp = 2;
  p.world_size = 2;
  p.seq_len = kSeqLen;
  p.steps = kSteps;
  p.data = SyntheticData(7);
  p.extra_top = {
      {"scheduler",
       {{"type", "WarmupCosineLR"},
        {"params",
         {{"total_num_steps", kSteps}, {"warmup_num_steps", 3}, {"warmup_type", "linear"}}}}}};
  // Evaluated after steps 4 and 9 ((s + 1) % 5 == 0) and the last one, 11.
  p.extra_latchkey = {{"eval", {{"tokens_file", "eval.bin"}, {"every_steps", 5}, {"samples", 3}}}};
  std::ofstream(dir + "/spec.json") << SpecJson(p);
  const int up = StartProcess(
      {LATCHKEY_CLI_BIN, "up", "--spec", dir + "/spec.json", "--run-dir", dir + "/run"}, {},
      dir + "/up.log");
  const int code = WaitProcess(up, seconds(300));
  const std::string log = ReadText(dir + "/up.log");
  ASSERT_EQ(code, 0) << log;

  const std::set<int> evaluated = {4, 9, 11};
  const auto rows = StepRecords(dir + "/run/steps-0.jsonl");
  ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps)) << log;
  std::vector<double> lr;
  std::vector<double> evals;
  for (int s = 0; s < kSteps; ++s) {
    const nlohmann::json& r = rows[static_cast<size_t>(s)];
    ASSERT_TRUE(r.contains("lr") && r["lr"].is_number()) << r.dump();
    lr.push_back(r["lr"].get<double>());
    EXPECT_EQ(r.contains("eval_loss"), evaluated.count(s) == 1) << r.dump();
    if (r.contains("eval_loss")) {
      const double e = r["eval_loss"].get<double>();
      EXPECT_GT(e, 0.0) << r.dump();
      EXPECT_LT(e, 10.0) << r.dump();  // about ln(256) = 5.5 untrained
      evals.push_back(e);
    }
  }
  // Warmup from 0 to the optimizer's lr, then a cosine decay below it.
  EXPECT_EQ(lr[0], 0.0);
  EXPECT_EQ(lr[0], lr[1]);
  const double peak = *std::max_element(lr.begin(), lr.end());
  EXPECT_LE(peak, kLr * (1 + 1e-12));
  EXPECT_GT(peak, 0.5 * kLr);
  EXPECT_LT(lr.back(), 0.5 * peak);
  // Step s runs at the schedule's value after s - 1 steps: the peak right after the warmup.
  const int top = static_cast<int>(std::max_element(lr.begin(), lr.end()) - lr.begin());
  EXPECT_GE(top, 3);
  EXPECT_LE(top, 4);
  for (int s = 1; s < kSteps; ++s) {
    if (s <= top) {
      EXPECT_GE(lr[s], lr[s - 1]) << "warmup, step " << s;
    } else {
      EXPECT_LE(lr[s], lr[s - 1]) << "decay, step " << s;
    }
  }
  // The progress lines come from the coordinator's step summaries: rank 0's eval loss, on the
  // evaluated steps only, with each step's lr.
  std::vector<double> shown;
  const std::regex eval_re("loss [0-9.]+ eval ([0-9.]+) lr ([0-9.e+-]+) ");
  for (std::sregex_iterator it(log.begin(), log.end(), eval_re), end; it != end; ++it) {
    shown.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(shown.size(), evals.size()) << log;
  for (size_t i = 0; i < evals.size(); ++i) EXPECT_NEAR(shown[i], evals[i], 5.1e-5) << log;
  for (double v : lr) {
    char text[32];
    std::snprintf(text, sizeof(text), " lr %.3e ", v);
    EXPECT_NE(log.find(text), std::string::npos) << text << "\n" << log;
  }
  // The summary: eval loss first -> final over the evaluations, and the lr range.
  char first_final[64];
  std::snprintf(first_final, sizeof(first_final), "%.4f -> %.4f  (3 evaluations, steps 4 .. 11)",
                evals.front(), evals.back());
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  eval loss first -> final +"))) << log;
  EXPECT_NE(log.find(first_final), std::string::npos) << first_final << "\n" << log;
  char range[64];
  std::snprintf(range, sizeof(range), "%.3e .. %.3e", 0.0, peak);
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  lr min \\.\\. max +"))) << log;
  EXPECT_NE(log.find(range), std::string::npos) << range << "\n" << log;
}

// Without recoveries (--max-restarts 0) a killed worker fails the job, naming its rank.
TEST(EndToEnd, KilledWorkerFailsTheJobNamingTheRank) {
  const std::string dir = NewDir("kill");
  std::ofstream(dir + "/spec.json") << E2eSpec(100000, "auto").dump(2);
  const int up =
      StartProcess({LATCHKEY_CLI_BIN, "up", "--spec", dir + "/spec.json", "--run-dir", dir + "/run",
                    "--liveness-timeout", "3", "--collective-timeout", "5", "--max-restarts", "0"},
                   {}, dir + "/up.log");
  const std::string out = WaitForFile(
      dir + "/up.log",
      [](const std::string& t) { return t.find("worker 1     pid") != std::string::npos; },
      seconds(120));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("worker 1     pid ([0-9]+)"))) << out;
  WaitForFile(
      dir + "/run/steps-1.jsonl", [](const std::string& t) { return Lines(t) >= 2; }, seconds(120));
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(std::stoi(m[1]), SIGKILL), 0);
  const int code = WaitProcess(up, seconds(90));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const std::string log = ReadText(dir + "/up.log");
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(code, -1) << "latchkey up hung; " << log;
  // The last progress line shows the job's end state (lowercase, as everywhere).
  EXPECT_TRUE(std::regex_search(log, std::regex("step [0-9]+/100000[^\n]* failed\n"))) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  // Liveness 3 s (+ heartbeat slack) to fail the job, the survivor's 5 s collective timeout,
  // and the coordinator's shutdown.
  EXPECT_LT(secs, 30.0) << log;
  // The surviving worker stopped by itself, with a message, before `up` had to kill it.
  const std::string w0 = ReadText(dir + "/run/worker-0.log");
  EXPECT_NE(w0.find("latchkey-worker:"), std::string::npos) << w0;
}

// A bug inside a window (an exception that is not a collective's failure) is INTERNAL and
// reported at once: the job fails naming the rank long before the coordinator's liveness
// verdict (60 s here) would have.
TEST(EndToEnd, InternalErrorIsReportedAtOnce) {
  const std::string dir = NewDir("internal");
  Coordinator coord(dir, /*liveness_s=*/"60");
  ASSERT_FALSE(coord.address().empty()) << ReadText(dir + "/coordinator.log");
  nlohmann::json spec = E2eSpec(20, "auto");
  spec["latchkey"]["max_restarts"] = 0;  // the failure ends the job rather than a recovery
  std::ofstream(dir + "/spec.json") << spec.dump(2);
  // A port of its own for the ranks' rendezvous: the default (29500) is shared with every other
  // job on this machine, ctest -j2's included.
  const Captured sub =
      coord.Cli({"submit", dir + "/spec.json", "--rendezvous-port", std::to_string(FreePort())});
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  std::smatch job, token;
  ASSERT_TRUE(std::regex_search(sub.output, job, std::regex("job_id: (\\S+)"))) << sub.output;
  ASSERT_TRUE(std::regex_search(sub.output, token, std::regex("join_token: (\\S+)"))) << sub.output;
  std::vector<int> pids;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {WorkerBinary(), "--coordinator", coord.address(), "--job",
                                     job[1].str(),   "--join-token",  token[1].str(),  "--quiet"};
    if (r == 1) args.insert(args.end(), {"--test-throw-at-window", "1"});
    pids.push_back(StartProcess(args, {"RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2"},
                                dir + "/worker-" + std::to_string(r) + ".log"));
  }
  const int code1 = WaitProcess(pids[1], seconds(60));
  const int code0 = WaitProcess(pids[0], seconds(60));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string w1 = ReadText(dir + "/worker-1.log");
  EXPECT_EQ(code1, 1) << w1;
  EXPECT_NE(w1.find("internal error: injected fault in window 1"), std::string::npos) << w1;
  EXPECT_NE(code0, 0) << ReadText(dir + "/worker-0.log");
  const Captured status = coord.Cli({"--json", "status", job[1].str()});
  EXPECT_NE(status.output.find("injected fault"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("rank 1"), std::string::npos) << status.output;
  // Start-up, one window, and the report: far below the 60 s liveness timeout.
  EXPECT_LT(secs, 40.0);
}

}  // namespace
}  // namespace latchkey::testing
