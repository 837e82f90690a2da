// Fleet benchmark (the simulated ranks are fleet_ranks.h): one latchkey-coordinator process
// (started here on loopback with a temporary SQLite database, stopped at the end) and N simulated
// ranks of one job in this process. Each rank speaks WorkerService as latchkey-worker does, over
// gRPC's callback API (a few channels, one latch stream per rank): Join with its rank and the job's
// join token, WatchLatches from window 0, a heartbeat with its position at the interval the
// coordinator said at Join (1 s up to 4,096 ranks; --heartbeat-seconds overrides), and per window:
// hold latch(s), "compute" T s +-10% (uniform jitter, as real ranks finish apart), then
// ReportStep(s) without waiting for the answer (the worker's sender thread does the same) and go on
// with latch(s+1). --node-size N (N > 0): node mode, the ranks' heartbeats and reports as a node
// agent of N ranks sends them (fleet_ranks.h): NodeHeartbeat and ReportSteps; a list runs each.
//
//   bench_fleet [--ranks 1024,4096] [--step-seconds 2] [--steps 10] [--channels 16]
//               [--heartbeat-seconds S] [--node-size 0,8]
//               [--lookahead L] [--coordinator-bin PATH] [--expect-success]
//
// Per run: join-all seconds (first Join sent -> every rank joined); latch wait p50/p99/max (a
// rank finished step s -> it holds latch s+1; 0 when it was there already); ReportStep and
// Heartbeat latency p50/p99; the coordinator's CPU per rank-step (/proc/PID/stat, from every
// rank joined to the job's end, heartbeats included); its resident memory at the end and its
// peak; SQLite bytes per rank-step (database growth from every rank joined to the end, the WAL
// checkpointed both times); and the job's final state. Both processes share this machine's
// cores: the simulated ranks' CPU is printed beside the coordinator's.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/coordinator/coordinator_process.h"
#include "bench/coordinator/fleet_ranks.h"
#include "bench/coordinator/timers.h"
#include "client/job_client.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "tests/support/metrics_scrape.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::bench {
namespace {

struct Row {
  int ranks = 0, steps = 0;
  int node_size = 0;  // 0: every rank calls on its own
  double step_seconds = 0;
  double join_all_s = 0;
  double wait_p50 = 0, wait_p99 = 0, wait_max = 0;
  double report_p50 = 0, report_p99 = 0, hb_p50 = 0, hb_p99 = 0;
  double heartbeat_s = 0;  // the ranks' heartbeat period (rank 0's)
  double cpu_ms_per_rank_step = 0, fleet_cpu_ms_per_rank_step = 0;
  double rss_mib = 0, peak_rss_mib = 0;
  double sqlite_bytes_per_rank_step = 0;
  // The coordinator's group commits (its /metrics): how many, their mean, and the seconds they
  // held its lock.
  double commits = 0, commit_ms_mean = 0, lock_held_by_commits_s = 0;
  double wall_s = 0;
  std::string state;
  std::string error;
};

double Pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

Row Run(const std::string& bin, const Options& o, int lookahead) {
  Row row;
  row.ranks = o.ranks;
  row.node_size = o.node_size;
  row.steps = o.steps;
  row.step_seconds = o.step_seconds;
  const testing::ScopedTempDir dir("fleet-bench");
  testing::CoordinatorOptions co;
  if (lookahead >= 0) co.extra = {"--latch-lookahead", std::to_string(lookahead)};
  co.metrics_host = "127.0.0.1";
  co.metrics_port = 0;  // a free one: the group commits are read from /metrics at the end
  CoordinatorProcess coord = StartCoordinator(bin, dir.path(), co);
  if (coord.port == 0) {
    StopCoordinator(coord);
    row.error = "coordinator did not start";
    return row;
  }
  const std::string address = "127.0.0.1:" + std::to_string(coord.port);
  JobClient client({address, absl::Seconds(60)});
  testing::SpecParams p;
  p.world_size = o.ranks;
  p.tp = 1;
  p.steps = o.steps;
  JobSubmission req;
  req.spec_json = testing::SpecJson(p);
  auto job = client.SubmitJob(req);
  if (!job.ok()) {
    row.error = std::string(job.status().message());
    StopCoordinator(coord);
    return row;
  }

  auto fleet = std::make_unique<Fleet>();
  fleet->o = o;
  fleet->job_id = job->job_id;
  fleet->token = job->join_token;
  for (int i = 0; i < o.channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel
    args.SetInt("latchkey.fleet_channel", i);
    args.SetMaxReceiveMessageSize(64 << 20);
    fleet->channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    fleet->stubs.push_back(v1::WorkerService::NewStub(fleet->channels.back()));
  }
  for (int i = 0; i < o.ranks; ++i) {
    fleet->ranks.push_back(std::make_unique<Rank>());
    fleet->ranks.back()->id = i;
    fleet->ranks.back()->fleet = fleet.get();
  }
  for (int k = 0; o.node_size > 0 && k * o.node_size < o.ranks; ++k) {
    fleet->nodes.push_back(std::make_unique<Node>());
    fleet->nodes.back()->id = k;
  }
  const absl::Time t0 = absl::Now();
  fleet->StartJoins();
  const absl::Time join_deadline = t0 + absl::Seconds(300);
  {
    absl::MutexLock lock(&fleet->mu);
    auto all = [&] { return fleet->joined == o.ranks || !fleet->first_error.empty(); };
    fleet->mu.AwaitWithDeadline(absl::Condition(&all), join_deadline);
    row.join_all_s = absl::ToDoubleSeconds(fleet->last_join - t0);
  }
  const double cpu_joined = ProcessCpuSeconds(coord.pid);
  const double fleet_cpu_joined = SelfCpuSeconds();
  const int64_t db_joined = CheckpointedDatabaseBytes(coord.db);
  const absl::Time t_joined = absl::Now();
  {
    absl::MutexLock lock(&fleet->mu);
    auto ended = [&] { return fleet->ended == o.ranks; };
    const absl::Duration budget = absl::Seconds(120 + 3 * o.step_seconds * o.steps);
    fleet->mu.AwaitWithDeadline(absl::Condition(&ended), absl::Now() + budget);
    if (fleet->ended != o.ranks && fleet->first_error.empty()) {
      fleet->first_error = std::to_string(o.ranks - fleet->ended) + " latch streams still open";
    }
  }
  row.wall_s = absl::ToDoubleSeconds(absl::Now() - t_joined);
  const double cpu_end = ProcessCpuSeconds(coord.pid);
  const double fleet_cpu_end = SelfCpuSeconds();
  row.rss_mib = static_cast<double>(ProcessRssBytes(coord.pid)) / (1 << 20);
  row.peak_rss_mib = static_cast<double>(ProcessPeakRssBytes(coord.pid)) / (1 << 20);
  auto final_job = client.GetJob(job->job_id);
  for (int i = 0; i < 50 && !final_job.ok(); ++i) {  // the ranks' last calls may be closing
    absl::SleepFor(absl::Milliseconds(100));
    final_job = client.GetJob(job->job_id);
  }
  row.state = final_job.ok() ? std::string(JobStateName(final_job->state))
                             : std::string(final_job.status().message());
  const std::string exposition = testing::ScrapeMetrics(coord.metrics_port);
  row.commits = testing::MetricSample(exposition, "latchkey_report_commit_seconds_count");
  if (row.commits > 0) {
    row.commit_ms_mean =
        1e3 * testing::MetricSample(exposition, "latchkey_report_commit_seconds_sum") / row.commits;
  }
  row.lock_held_by_commits_s =
      testing::MetricSample(exposition, "latchkey_coordinator_lock_held_by_commits_seconds_total");
  const bool clean = StopCoordinator(coord);
  const int64_t db_end = CheckpointedDatabaseBytes(coord.db);
  const double rank_steps = static_cast<double>(o.ranks) * o.steps;
  row.cpu_ms_per_rank_step = 1e3 * (cpu_end - cpu_joined) / rank_steps;
  row.fleet_cpu_ms_per_rank_step = 1e3 * (fleet_cpu_end - fleet_cpu_joined) / rank_steps;
  row.sqlite_bytes_per_rank_step = static_cast<double>(db_end - db_joined) / rank_steps;
  std::vector<double> wait, report, hb;
  for (auto& r : fleet->ranks) {
    absl::MutexLock lock(&r->mu);
    wait.insert(wait.end(), r->latch_wait_ms.begin(), r->latch_wait_ms.end());
    report.insert(report.end(), r->report_ms.begin(), r->report_ms.end());
    hb.insert(hb.end(), r->heartbeat_ms.begin(), r->heartbeat_ms.end());
  }
  row.wait_p50 = Pct(wait, 0.5);
  row.wait_p99 = Pct(wait, 0.99);
  row.wait_max = wait.empty() ? 0 : wait.back();
  row.report_p50 = Pct(report, 0.5);
  row.report_p99 = Pct(report, 0.99);
  {
    absl::MutexLock lock(&fleet->ranks[0]->mu);
    row.heartbeat_s = absl::ToDoubleSeconds(fleet->ranks[0]->heartbeat_every);
  }
  row.hb_p50 = Pct(hb, 0.5);
  row.hb_p99 = Pct(hb, 0.99);
  {
    absl::MutexLock lock(&fleet->mu);
    row.error = fleet->first_error;
  }
  if (row.error.empty() && report.size() != static_cast<size_t>(rank_steps)) {
    row.error = std::to_string(report.size()) + " step reports acknowledged, expected " +
                std::to_string(static_cast<int64_t>(rank_steps));
  }
  if (row.error.empty() && !clean) row.error = "coordinator did not shut down cleanly";
  // Every callback has run before the fleet goes (the streams ended above).
  for (int i = 0; i < 700 && fleet->in_flight.load() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (fleet->in_flight.load() > 0) {
    std::fprintf(stderr, "bench_fleet: %d calls still in flight\n", fleet->in_flight.load());
    std::quick_exit(row.error.empty() ? 1 : 2);
  }
  return row;
}

}  // namespace
}  // namespace latchkey::bench

int main(int argc, char** argv) {
  using namespace latchkey::bench;
  CLI::App app{"latchkey coordinator fleet benchmark: N simulated ranks against one coordinator"};
  std::string ranks_list = "1024,4096";
  std::string node_sizes = "0";
  Options o;
  int lookahead = -1;
  bool expect_success = false;
  std::string bin = LATCHKEY_COORDINATOR_BIN;
  app.add_option("--ranks", ranks_list, "comma-separated rank counts, one run each")
      ->capture_default_str();
  app.add_option("--step-seconds", o.step_seconds, "compute time per window (+-10% jitter)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "windows (optimizer steps) per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--channels", o.channels, "gRPC channels (connections) the ranks share")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  double heartbeat_s = 0;
  app.add_option("--heartbeat-seconds", heartbeat_s,
                 "heartbeat period (0: the interval the coordinator said at Join)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--node-size", node_sizes,
                 "comma-separated: 0 = every rank calls on its own; N = node mode, N ranks per "
                 "node agent (one run each)")
      ->capture_default_str();
  app.add_option("--join-window", o.join_window, "Join calls in flight at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lookahead", lookahead, "coordinator --latch-lookahead (-1: its default)")
      ->capture_default_str();
  app.add_option("--coordinator-bin", bin, "latchkey-coordinator binary")->capture_default_str();
  app.add_flag("--expect-success", expect_success,
               "exit 1 unless every run's job SUCCEEDED with every step acknowledged");
  CLI11_PARSE(app, argc, argv);
  o.heartbeat_every = absl::Seconds(heartbeat_s);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see server/main.cc

  latchkey::bench::RaiseOpenFileLimit();

  std::vector<Row> rows;
  for (absl::string_view s : absl::StrSplit(ranks_list, ',')) {
    for (absl::string_view n : absl::StrSplit(node_sizes, ',')) {
      o.ranks = std::atoi(std::string(s).c_str());
      o.node_size = std::atoi(std::string(n).c_str());
      std::cerr << "bench_fleet: " << o.ranks << " ranks x " << o.steps << " steps of "
                << o.step_seconds << " s"
                << (o.node_size > 0 ? ", nodes of " + std::to_string(o.node_size) : "") << "..."
                << std::endl;
      rows.push_back(Run(bin, o, lookahead));
    }
  }
  std::printf("\nfleet (%u cores; coordinator and simulated ranks on one machine; %d channels)\n",
              std::thread::hardware_concurrency(), o.channels);
  std::printf(
      "| ranks | calls | step s | steps | join-all s | latch wait p50 / p99 / max ms | ReportStep "
      "p50 / "
      "p99 ms | heartbeat every s | Heartbeat p50 / p99 ms | coordinator CPU ms/rank-step | ranks' "
      "CPU "
      "ms/rank-step | coordinator RSS MiB (peak) | SQLite B/rank-step | wall s | job |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (const Row& r : rows) {
    std::printf(
        "| %d | %s | %.1f | %d | %.2f | %.1f / %.1f / %.1f | %.1f / %.1f | %.1f | %.1f / %.1f | "
        "%.4f "
        "| %.4f | %.0f (%.0f) | %.1f | %.1f | %s |\n",
        r.ranks, r.node_size > 0 ? ("nodes of " + std::to_string(r.node_size)).c_str() : "per rank",
        r.step_seconds, r.steps, r.join_all_s, r.wait_p50, r.wait_p99, r.wait_max, r.report_p50,
        r.report_p99, r.heartbeat_s, r.hb_p50, r.hb_p99, r.cpu_ms_per_rank_step,
        r.fleet_cpu_ms_per_rank_step, r.rss_mib, r.peak_rss_mib, r.sqlite_bytes_per_rank_step,
        r.wall_s, r.state.c_str());
    if (!r.error.empty()) std::printf("  ranks %d: error: %s\n", r.ranks, r.error.c_str());
    if (expect_success && (r.state != "succeeded" || !r.error.empty())) rc = 1;
  }
  std::printf(
      "\n| ranks | calls | group commits | commit ms mean | lock held by commits s (%% of "
      "wall) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %s | %.0f | %.3f | %.3f (%.2f%%) |\n", r.ranks,
                r.node_size > 0 ? ("nodes of " + std::to_string(r.node_size)).c_str() : "per rank",
                r.commits, r.commit_ms_mean, r.lock_held_by_commits_s,
                r.wall_s > 0 ? 100 * r.lock_held_by_commits_s / r.wall_s : 0.0);
  }
  return rc;
}
