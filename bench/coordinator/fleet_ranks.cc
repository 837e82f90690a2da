// bench_fleet's simulated ranks (fleet_ranks.h): each call and the latch stream, over gRPC's
// callback API.
#include "bench/coordinator/fleet_ranks.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace latchkey::bench {
namespace {

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

}  // namespace

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
  if (o.node_size > 0) {
    // The node's agent heartbeats from its first rank's join on, for the ranks joined.
    Node& n = *nodes[static_cast<size_t>(r.id / o.node_size)];
    bool start = false;
    {
      absl::MutexLock lock(&n.mu);
      start = !n.heartbeating;
      n.heartbeating = true;
    }
    if (start) timers.At(absl::Now() + absl::Milliseconds(ms), [this, &n] { NodeHeartbeat(n); });
  } else {
    timers.At(absl::Now() + absl::Milliseconds(ms), [this, &r] { Heartbeat(r); });
  }
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
  timers.At(r.phase_start + Jittered(r), [this, &r] { ComputeDone(r); });
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
  if (o.node_size > 0) {
    NodeReport(r, std::move(c->req));
    delete c;
    return;
  }
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

// Node mode: the report waits for the node's other ranks' of the same step, then one
// ReportSteps carries them all; each rank's latency is the node call's.
void Fleet::NodeReport(Rank& r, v1::ReportStepRequest req) {
  Node& n = *nodes[static_cast<size_t>(r.id / o.node_size)];
  auto* c = new Call<v1::ReportStepsRequest, v1::ReportStepsResponse>(this);
  {
    absl::MutexLock lock(&n.mu);
    std::vector<v1::ReportStepRequest>& step = n.reports[req.step()];
    step.push_back(std::move(req));
    if (static_cast<int>(step.size()) < o.node_size) {
      delete c;
      return;
    }
    c->req.set_node("node-" + std::to_string(n.id));
    for (v1::ReportStepRequest& one : step) *c->req.add_reports() = std::move(one);
    n.reports.erase(c->req.reports(0).step());
  }
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  c->sent = absl::Now();
  Stub(n.id)->async()->ReportSteps(&c->ctx, &c->req, &c->resp, [this, c](grpc::Status s) {
    std::unique_ptr<Call<v1::ReportStepsRequest, v1::ReportStepsResponse>> own(c);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - c->sent);
    if (!s.ok()) return Fail("ReportSteps: " + s.error_message());
    for (int i = 0; i < c->resp.statuses_size(); ++i) {
      if (c->resp.statuses(i).code() != 0) {
        return Fail("ReportSteps rank " + std::to_string(c->req.reports(i).rank()) + ": " +
                    c->resp.statuses(i).message());
      }
    }
    for (const v1::ReportStepRequest& one : c->req.reports()) {
      Rank& r = *ranks[static_cast<size_t>(one.rank())];
      absl::MutexLock lock(&r.mu);
      r.report_ms.push_back(ms);
    }
  });
}

// Node mode: one NodeHeartbeat with the positions of the node's joined ranks, every interval
// (its first rank's), until every rank of the node is done.
void Fleet::NodeHeartbeat(Node& n) {
  auto* c = new Call<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>(this);
  c->req.set_node("node-" + std::to_string(n.id));
  const int first = n.id * o.node_size;
  absl::Duration every = absl::Seconds(1);
  for (int i = first; i < first + o.node_size && i < o.ranks; ++i) {
    Rank& r = *ranks[static_cast<size_t>(i)];
    {
      absl::MutexLock lock(&r.mu);
      if (r.attempt == 0) continue;  // not joined yet
      every = r.heartbeat_every;
    }
    v1::HeartbeatRequest hb;
    if (Position(r, &hb)) *c->req.add_heartbeats() = std::move(hb);
  }
  if (c->req.heartbeats_size() == 0) {
    delete c;
    return;  // every rank of the node is done
  }
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  c->sent = absl::Now();
  timers.At(c->sent + every, [this, &n] { NodeHeartbeat(n); });
  Stub(n.id)->async()->NodeHeartbeat(&c->ctx, &c->req, &c->resp, [this, c](grpc::Status s) {
    std::unique_ptr<Call<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>> own(c);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - c->sent);
    if (!s.ok()) return Fail("NodeHeartbeat: " + s.error_message());
    for (int i = 0; i < c->req.heartbeats_size(); ++i) {
      Rank& r = *ranks[static_cast<size_t>(c->req.heartbeats(i).rank())];
      const bool ok = c->resp.statuses_size() > i && c->resp.statuses(i).code() == 0;
      bool done = false;
      {
        absl::MutexLock lock(&r.mu);
        done = r.done;  // the job ended: a late heartbeat may be refused
        if (!done && ok) r.heartbeat_ms.push_back(ms);
      }
      if (!done && !ok) {
        Fail("NodeHeartbeat rank " + std::to_string(r.id) + ": " +
             (c->resp.statuses_size() > i ? c->resp.statuses(i).message() : "no answer"));
      }
    }
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

}  // namespace latchkey::bench
