// Fleet benchmark: one latchkey-coordinator process (started here on loopback with a temporary
// SQLite database, stopped at the end) and N simulated ranks of one job in this process. Each
// rank speaks WorkerService as latchkey-worker does, over gRPC's callback API (a few channels,
// one latch stream per rank): Join with its rank and the job's join token, WatchLatches from
// window 0, a heartbeat with its position at the interval the coordinator said at Join (1 s up
// to 4,096 ranks; --heartbeat-seconds overrides), and per window: hold latch(s), "compute"
// T s +-10% (uniform jitter, as real ranks finish apart), then ReportStep(s) without waiting for
// the answer (the worker's sender thread does the same) and go on with latch(s+1).
//
//   bench_fleet [--ranks 1024,4096] [--step-seconds 2] [--steps 10] [--channels 16]
//               [--heartbeat-seconds S]
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
#include <atomic>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/coordinator/coordinator_process.h"
#include "bench/coordinator/timers.h"
#include "client/job_client.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "tests/support/free_port.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::bench {
namespace {

namespace v1 = latchkey::v1;

struct Options {
  int ranks = 0;
  double step_seconds = 2;
  int steps = 10;
  int channels = 16;
  int join_window = 1024;  // Joins in flight at once
  // Heartbeat period; zero: the interval the coordinator said at Join (as latchkey-worker).
  absl::Duration heartbeat_every = absl::ZeroDuration();
};

struct Fleet;

// One simulated rank. Its fields are guarded by mu.
struct Rank {
  int id = 0;
  Fleet* fleet = nullptr;
  absl::Mutex mu;
  int64_t attempt = 0;
  absl::Duration heartbeat_every = absl::Seconds(1);
  std::vector<v1::Latch> latches;  // by window; window w present when latches.size() > w
  int64_t next_step = 0;           // the step it computes next
  bool computing = false;
  bool done = false;                           // its stream ended
  absl::Time phase_start;                      // when it began computing or waiting
  absl::Time finished = absl::InfinitePast();  // when it finished step next_step - 1
  std::vector<double> latch_wait_ms, report_ms, heartbeat_ms;
};

struct Fleet {
  Options o;
  std::string job_id, token;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  std::vector<std::unique_ptr<Rank>> ranks;
  Timers timers;
  std::mt19937 rng{12345};
  absl::Mutex mu;  // below
  int joined = 0, next_join = 0, ended = 0;
  absl::Time last_join;
  std::string first_error;
  std::atomic<int> in_flight{0};  // unary calls whose callback has not run yet

  v1::WorkerService::Stub* Stub(int rank) { return stubs[rank % stubs.size()].get(); }
  void Fail(const std::string& what) {
    absl::MutexLock lock(&mu);
    if (first_error.empty()) first_error = what;
  }
  absl::Duration Jittered() {
    absl::MutexLock lock(&mu);
    std::uniform_real_distribution<double> d(0.9 * o.step_seconds, 1.1 * o.step_seconds);
    return absl::Seconds(d(rng));
  }
  void Identity(Rank& r, v1::WorkerIdentity* id) {
    id->set_job_id(job_id);
    id->set_join_token(token);
    id->set_worker_id("fleet-" + std::to_string(r.id));
    absl::MutexLock lock(&r.mu);
    id->set_attempt(r.attempt);
  }

  void StartJoins() {
    std::vector<int> first;
    {
      absl::MutexLock lock(&mu);
      while (next_join < o.ranks && next_join < o.join_window) first.push_back(next_join++);
    }
    for (int i : first) Join(*ranks[i], 0);
  }
  void Join(Rank& r, int tries);
  void Joined(Rank& r, const v1::JoinResponse& resp);
  void OnLatch(Rank& r, const v1::Latch& latch);
  void StartCompute(Rank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu);
  void ComputeDone(Rank& r);
  void Report(Rank& r, const v1::Latch& latch);
  void Heartbeat(Rank& r);
  bool Position(Rank& r, v1::HeartbeatRequest* req);
  void StreamEnded(Rank& r, const grpc::Status& s, const std::string& state);
};

// A unary call's state, alive until its callback ran.
template <typename Req, typename Resp>
struct Call {
  explicit Call(Fleet* f) : fleet(f) { fleet->in_flight++; }
  ~Call() { fleet->in_flight--; }
  Fleet* fleet;
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
  absl::Time sent;
};

void Fleet::Join(Rank& r, int tries) {
  auto* c = new Call<v1::JoinRequest, v1::JoinResponse>(this);
  Identity(r, c->req.mutable_identity());
  c->req.mutable_requested_rank()->set_value(r.id);
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  Stub(r.id)->async()->Join(&c->ctx, &c->req, &c->resp, [this, &r, c, tries](grpc::Status s) {
    std::unique_ptr<Call<v1::JoinRequest, v1::JoinResponse>> own(c);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && tries < 20) {
        timers.At(absl::Now() + absl::Milliseconds(200), [this, &r, tries] { Join(r, tries + 1); });
        return;
      }
      return Fail("Join rank " + std::to_string(r.id) + ": " + s.error_message());
    }
    Joined(r, c->resp);
  });
}

// The latch stream of one rank: reads until JobEnded.
class LatchReader : public grpc::ClientReadReactor<v1::WatchLatchesResponse> {
 public:
  LatchReader(Fleet* f, Rank* r) : fleet_(f), rank_(r) {
    f->in_flight++;
    f->Identity(*r, req_.mutable_identity());
    req_.set_rank(r->id);
    req_.set_start_window(0);
    f->Stub(r->id)->async()->WatchLatches(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (resp_.has_latch()) {
      fleet_->OnLatch(*rank_, resp_.latch());
    } else if (resp_.has_job_ended()) {
      state_ = v1::JobState_Name(resp_.job_ended().state());
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    Fleet* f = fleet_;
    f->StreamEnded(*rank_, s, state_);
    delete this;
    f->in_flight--;
  }

 private:
  Fleet* fleet_;
  Rank* rank_;
  grpc::ClientContext ctx_;
  v1::WatchLatchesRequest req_;
  v1::WatchLatchesResponse resp_;
  std::string state_;
};

void Fleet::Joined(Rank& r, const v1::JoinResponse& resp) {
  {
    absl::MutexLock lock(&r.mu);
    r.attempt = resp.attempt();
    r.phase_start = absl::Now();
    r.heartbeat_every = o.heartbeat_every > absl::ZeroDuration()
                            ? o.heartbeat_every
                            : absl::Seconds(resp.heartbeat_interval().seconds()) +
                                  absl::Nanoseconds(resp.heartbeat_interval().nanos());
  }
  new LatchReader(this, &r);
  // The first heartbeat within one interval, spread so the fleet does not beat in step.
  int every_ms = 1000;
  {
    absl::MutexLock lock(&r.mu);
    every_ms = std::max(1, static_cast<int>(absl::ToInt64Milliseconds(r.heartbeat_every)));
  }
  std::uniform_int_distribution<int> spread(0, every_ms - 1);
  int next = -1;
  int ms = 0;
  {
    absl::MutexLock lock(&mu);
    ms = spread(rng);
    joined++;
    last_join = absl::Now();
    if (next_join < o.ranks) next = next_join++;
  }
  timers.At(absl::Now() + absl::Milliseconds(ms), [this, &r] { Heartbeat(r); });
  if (next >= 0) Join(*ranks[next], 0);
}

void Fleet::OnLatch(Rank& r, const v1::Latch& latch) {
  absl::MutexLock lock(&r.mu);
  if (latch.window() != static_cast<int64_t>(r.latches.size())) {
    return Fail("rank " + std::to_string(r.id) + ": latch " + std::to_string(latch.window()) +
                " out of order");
  }
  r.latches.push_back(latch);
  if (!r.computing && r.next_step == latch.window() && r.next_step < o.steps) {
    if (r.finished != absl::InfinitePast()) {
      r.latch_wait_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - r.finished));
    }
    StartCompute(r);
  }
}

void Fleet::StartCompute(Rank& r) {
  r.computing = true;
  r.phase_start = absl::Now();
  timers.At(r.phase_start + Jittered(), [this, &r] { ComputeDone(r); });
}

void Fleet::ComputeDone(Rank& r) {
  v1::Latch latch;
  {
    absl::MutexLock lock(&r.mu);
    latch = r.latches[static_cast<size_t>(r.next_step)];
    r.computing = false;
    r.finished = r.phase_start = absl::Now();
    r.next_step++;
    if (r.next_step < o.steps && r.next_step < static_cast<int64_t>(r.latches.size())) {
      r.latch_wait_ms.push_back(0);  // the latch was there already
      StartCompute(r);
    }
  }
  Report(r, latch);
}

void Fleet::Report(Rank& r, const v1::Latch& latch) {
  auto* c = new Call<v1::ReportStepRequest, v1::ReportStepResponse>(this);
  Identity(r, c->req.mutable_identity());
  c->req.set_rank(r.id);
  c->req.set_step(latch.window());
  c->req.set_micro_batches(latch.micro_batches());
  c->req.set_kv_mode(latch.kv_mode());
  c->req.set_latch_generation(latch.generation());
  c->req.set_loss(10.0 / static_cast<double>(latch.window() + 1));
  c->req.set_grad_norm(1.0);
  c->req.set_step_seconds(o.step_seconds);
  c->req.set_tokens(1024);
  c->req.set_lr(0.001);
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  c->sent = absl::Now();
  Stub(r.id)->async()->ReportStep(&c->ctx, &c->req, &c->resp, [this, &r, c](grpc::Status s) {
    std::unique_ptr<Call<v1::ReportStepRequest, v1::ReportStepResponse>> own(c);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - c->sent);
    if (!s.ok()) {
      return Fail("ReportStep rank " + std::to_string(r.id) + " step " +
                  std::to_string(c->req.step()) + ": " + s.error_message());
    }
    absl::MutexLock lock(&r.mu);
    r.report_ms.push_back(ms);
  });
}

// The rank's position into `req`; false once its job ended.
bool Fleet::Position(Rank& r, v1::HeartbeatRequest* req) {
  Identity(r, req->mutable_identity());
  req->set_rank(r.id);
  absl::MutexLock lock(&r.mu);
  if (r.done) return false;
  v1::RankPosition* p = req->mutable_position();
  p->set_attempt(r.attempt);
  p->set_window(r.next_step);
  p->set_phase(r.computing ? "compute" : "latch");
  const absl::Duration in = absl::Now() - r.phase_start;
  p->mutable_in_position()->set_seconds(absl::ToInt64Seconds(in));
  p->mutable_in_position()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(in - absl::Trunc(in, absl::Seconds(1)))));
  return true;
}

void Fleet::Heartbeat(Rank& r) {
  auto* c = new Call<v1::HeartbeatRequest, v1::HeartbeatResponse>(this);
  if (!Position(r, &c->req)) {
    delete c;
    return;
  }
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  c->sent = absl::Now();
  absl::Duration every;
  {
    absl::MutexLock lock(&r.mu);
    every = r.heartbeat_every;
  }
  timers.At(c->sent + every, [this, &r] { Heartbeat(r); });
  Stub(r.id)->async()->Heartbeat(&c->ctx, &c->req, &c->resp, [this, &r, c](grpc::Status s) {
    std::unique_ptr<Call<v1::HeartbeatRequest, v1::HeartbeatResponse>> own(c);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - c->sent);
    bool failed = false;
    {
      absl::MutexLock lock(&r.mu);
      if (r.done) return;  // the job ended: a late heartbeat may be refused
      failed = !s.ok();
      if (!failed) r.heartbeat_ms.push_back(ms);
    }
    if (failed) Fail("Heartbeat rank " + std::to_string(r.id) + ": " + s.error_message());
  });
}

void Fleet::StreamEnded(Rank& r, const grpc::Status& s, const std::string& state) {
  {
    absl::MutexLock lock(&r.mu);
    r.done = true;
  }
  if (!s.ok()) Fail("WatchLatches rank " + std::to_string(r.id) + ": " + s.error_message());
  absl::MutexLock lock(&mu);
  ended++;
  if (state != "JOB_STATE_SUCCEEDED" && first_error.empty()) {
    first_error = "rank " + std::to_string(r.id) + ": the stream ended with " + state;
  }
}

struct Row {
  int ranks = 0, steps = 0;
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
  row.steps = o.steps;
  row.step_seconds = o.step_seconds;
  const testing::ScopedTempDir dir("fleet-bench");
  std::vector<std::string> flags;
  if (lookahead >= 0) flags = {"--latch-lookahead", std::to_string(lookahead)};
  const int metrics_port = testing::FreePort();
  for (std::string f : {"--metrics-host", "127.0.0.1", "--metrics-port"}) flags.push_back(f);
  flags.push_back(std::to_string(metrics_port));
  CoordinatorProcess coord = StartCoordinator(bin, dir.path(), flags);
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
  const std::string exposition = ScrapeMetrics(metrics_port);
  row.commits = MetricValue(exposition, "latchkey_report_commit_seconds_count");
  if (row.commits > 0) {
    row.commit_ms_mean =
        1e3 * MetricValue(exposition, "latchkey_report_commit_seconds_sum") / row.commits;
  }
  row.lock_held_by_commits_s =
      MetricValue(exposition, "latchkey_coordinator_lock_held_by_commits_seconds_total");
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
    o.ranks = std::atoi(std::string(s).c_str());
    std::cerr << "bench_fleet: " << o.ranks << " ranks x " << o.steps << " steps of "
              << o.step_seconds << " s..." << std::endl;
    rows.push_back(Run(bin, o, lookahead));
  }
  std::printf("\nfleet (%u cores; coordinator and simulated ranks on one machine; %d channels)\n",
              std::thread::hardware_concurrency(), o.channels);
  std::printf(
      "| ranks | step s | steps | join-all s | latch wait p50 / p99 / max ms | ReportStep p50 / "
      "p99 ms | heartbeat every s | Heartbeat p50 / p99 ms | coordinator CPU ms/rank-step | ranks' "
      "CPU "
      "ms/rank-step | coordinator RSS MiB (peak) | SQLite B/rank-step | wall s | job |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (const Row& r : rows) {
    std::printf(
        "| %d | %.1f | %d | %.2f | %.1f / %.1f / %.1f | %.1f / %.1f | %.1f | %.1f / %.1f | %.4f "
        "| %.4f | %.0f (%.0f) | %.1f | %.1f | %s |\n",
        r.ranks, r.step_seconds, r.steps, r.join_all_s, r.wait_p50, r.wait_p99, r.wait_max,
        r.report_p50, r.report_p99, r.heartbeat_s, r.hb_p50, r.hb_p99, r.cpu_ms_per_rank_step,
        r.fleet_cpu_ms_per_rank_step, r.rss_mib, r.peak_rss_mib, r.sqlite_bytes_per_rank_step,
        r.wall_s, r.state.c_str());
    if (!r.error.empty()) std::printf("  ranks %d: error: %s\n", r.ranks, r.error.c_str());
    if (expect_success && (r.state != "succeeded" || !r.error.empty())) rc = 1;
  }
  std::printf(
      "\n| ranks | group commits | commit ms mean | lock held by commits s (%% of wall) |\n");
  std::printf("|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %.0f | %.3f | %.3f (%.2f%%) |\n", r.ranks, r.commits, r.commit_ms_mean,
                r.lock_held_by_commits_s,
                r.wall_s > 0 ? 100 * r.lock_held_by_commits_s / r.wall_s : 0.0);
  }
  return rc;
}
