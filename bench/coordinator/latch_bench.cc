// Latch delivery benchmark: one job of N ranks (simulated workers: threads, each with its own
// WorkerSession, gRPC channel and latch stream) against an out-of-process latchkey-coordinator.
// Every rank waits for latch(s), reports step s, and moves on, so each window is published once
// every rank has reported the previous one (lookahead 0) and then fans out to N streams.
//
//   latch_bench [--streams 256,1024] [--windows 30] [--lookahead 0] [--coordinator-bin PATH]
//
// Prints, per N: latch delivery latency (coordinator persisted it -> the rank has it; both
// clocks are this machine's) p50/p99/max; how long a rank sat in AwaitLatch (what training would
// stall; with --lookahead > 0 the latch is usually there already); windows per second; and CPU:
// the coordinator's (from /proc/PID/stat) and the simulated workers' (this process), in cores.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/coordinator/coordinator_process.h"
#include "client/job_client.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/session/worker_session.h"

namespace {

using latchkey::JobClient;
using latchkey::WorkerSession;
using latchkey::WorkerSessionOptions;
using latchkey::bench::CoordinatorProcess;
using latchkey::bench::ProcessCpuSeconds;
using latchkey::bench::SelfCpuSeconds;
using latchkey::bench::StartCoordinator;
using latchkey::bench::StopCoordinator;

struct Row {
  int streams = 0;
  int windows = 0;
  size_t deliveries = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double wait_p50_ms = 0, wait_p99_ms = 0;  // time a rank spent blocked in AwaitLatch
  double windows_per_s = 0;
  double coord_cores = 0, coord_us_per_delivery = 0, workers_cores = 0;
  std::string error;
};

Row Run(const std::string& bin, int streams, int windows, int lookahead) {
  Row row;
  row.streams = streams;
  row.windows = windows;
  const latchkey::testing::ScopedTempDir dir("latch-bench");
  CoordinatorProcess coord = StartCoordinator(
      bin, dir.path(),
      {"--liveness-timeout", "600", "--latch-lookahead", std::to_string(lookahead)});
  if (coord.port == 0) {
    StopCoordinator(coord);
    row.error = "coordinator did not start";
    return row;
  }
  const std::string address = "127.0.0.1:" + std::to_string(coord.port);
  JobClient client({address, absl::Seconds(30)});
  latchkey::testing::SpecParams p;
  p.world_size = streams;
  p.tp = 1;
  p.steps = windows;
  latchkey::JobSubmission req;
  req.spec_json = latchkey::testing::SpecJson(p);
  auto job = client.SubmitJob(req);
  if (!job.ok()) {
    row.error = std::string(job.status().message());
    StopCoordinator(coord);
    return row;
  }

  absl::Mutex mu;
  int joined = 0;
  bool go = false;
  std::vector<double> latencies_ms;
  std::vector<double> waits_ms;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      WorkerSessionOptions o;
      o.coordinator = address;
      o.job_id = job->job_id;
      o.join_token = job->join_token;
      o.worker_id = "bench-" + std::to_string(i);
      o.heartbeat = false;  // the coordinator runs with a 600 s liveness timeout
      o.rpc_timeout = absl::Seconds(60);
      std::vector<double> mine;
      std::vector<double> waited;
      auto fail = [&](const absl::Status& s) {
        absl::MutexLock lock(&mu);
        if (first_error.empty()) first_error = std::string(s.ToString());
      };
      {
        absl::MutexLock lock(&mu);  // joins one after another: 1024 at once is a stampede
        joined++;
      }
      auto session = WorkerSession::Join(o);
      if (!session.ok()) return fail(session.status());
      (*session)->StartLatches(0);
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&go));
      }
      for (int64_t s = 0; s < windows; ++s) {
        const absl::Time asked = absl::Now();
        auto latch = (*session)->AwaitLatch(s, absl::Seconds(120));
        if (!latch.ok()) return fail(latch.status());
        waited.push_back(absl::ToDoubleMilliseconds(absl::Now() - asked));
        mine.push_back(absl::ToDoubleMilliseconds(latch->receive_time - latch->publish_time));
        latchkey::StepMetrics m;
        m.step = s;
        m.micro_batches = latch->latch.n;
        m.kv_mode = latch->latch.kv_mode;
        m.latch_generation = latch->latch.generation;
        absl::Status st = (*session)->ReportStep(m);
        if (!st.ok()) return fail(st);
      }
      absl::MutexLock lock(&mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
      waits_ms.insert(waits_ms.end(), waited.begin(), waited.end());
    });
  }
  // Wait until every rank holds its stream, then measure from the first window on.
  for (int i = 0; i < 6000; ++i) {
    auto j = client.GetJob(job->job_id);
    if (j.ok() && j->state == latchkey::JobState::kRunning) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double coord_cpu0 = ProcessCpuSeconds(coord.pid);
  const double self_cpu0 = SelfCpuSeconds();
  const absl::Time t0 = absl::Now();
  {
    absl::MutexLock lock(&mu);
    go = true;
  }
  for (auto& t : threads) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const double coord_cpu = ProcessCpuSeconds(coord.pid) - coord_cpu0;
  const double self_cpu = SelfCpuSeconds() - self_cpu0;
  if (!StopCoordinator(coord) && first_error.empty()) {
    first_error = "coordinator did not shut down cleanly on SIGTERM";
  }
  if (!first_error.empty()) {
    row.error = first_error;
    return row;
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  std::sort(waits_ms.begin(), waits_ms.end());
  auto pct = [](const std::vector<double>& v, double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  row.deliveries = latencies_ms.size();
  row.p50_ms = pct(latencies_ms, 0.50);
  row.p99_ms = pct(latencies_ms, 0.99);
  row.max_ms = latencies_ms.back();
  row.wait_p50_ms = pct(waits_ms, 0.50);
  row.wait_p99_ms = pct(waits_ms, 0.99);
  row.windows_per_s = windows / wall;
  row.coord_cores = coord_cpu / wall;
  row.coord_us_per_delivery = 1e6 * coord_cpu / static_cast<double>(row.deliveries);
  row.workers_cores = self_cpu / wall;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"latchkey coordinator latch delivery benchmark"};
  std::string streams_list = "256,1024";
  int windows = 30;
  int lookahead = 0;
  std::string bin = LATCHKEY_COORDINATOR_BIN;
  app.add_option("--streams", streams_list, "comma-separated stream counts")->capture_default_str();
  app.add_option("--windows", windows, "windows (optimizer steps) per run")->capture_default_str();
  app.add_option("--lookahead", lookahead, "coordinator --latch-lookahead")->capture_default_str();
  app.add_option("--coordinator-bin", bin, "latchkey-coordinator binary")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see server/main.cc

  // 1 socket per stream plus gRPC's own descriptors, in both processes.
  latchkey::bench::RaiseOpenFileLimit();

  std::vector<Row> rows;
  for (absl::string_view s : absl::StrSplit(streams_list, ',')) {
    const int n = std::atoi(std::string(s).c_str());
    std::cerr << "latch_bench: " << n << " streams x " << windows << " windows..." << std::endl;
    rows.push_back(Run(bin, n, windows, lookahead));
  }
  std::printf("\nlatch delivery (lookahead %d; %u cores; coordinator and workers on one machine)\n",
              lookahead, std::thread::hardware_concurrency());
  std::printf(
      "| streams | windows | deliveries | delivery p50 ms | delivery p99 ms | max ms |"
      " rank wait p50 ms | rank wait p99 ms | windows/s | coordinator CPU (cores) |"
      " coordinator CPU us/delivery | workers CPU (cores) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::printf("| %d | %d | error: %s |\n", r.streams, r.windows, r.error.c_str());
      rc = 1;
      continue;
    }
    std::printf(
        "| %d | %d | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.1f | %.2f |\n",
        r.streams, r.windows, r.deliveries, r.p50_ms, r.p99_ms, r.max_ms, r.wait_p50_ms,
        r.wait_p99_ms, r.windows_per_s, r.coord_cores, r.coord_us_per_delivery, r.workers_cores);
  }
  return rc;
}
