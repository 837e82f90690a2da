// The heartbeat thread of a WorkerSession (worker_session.h, session_impl.h): heartbeats at the
// interval the coordinator asked for (and at once when the rank moved to another window or
// attempt), and the stuck-rank watchdog. As c10d's heartbeat monitor beside its watchdog, this
// thread has one job apart from the latch reader's and the unary calls': keep the coordinator's
// view of the rank fresh, and end a process that can no longer leave a fenced attempt.
//
// Thread contract:
//   HeartbeatLoop, CheckStuck
//               run on the heartbeat thread (`heart`), started by Join (options.heartbeat) and
//               joined by Close. Under `mu` they read info, fenced, fenced_since, recovering,
//               end, closed; options.position is called without `mu`. CheckStuck may _exit the
//               process (kExitRestartMe).
//   BeginRecovery
//               the training thread: sets recovering under `mu`, which disarms CheckStuck.
//   HeartbeatOnce
//               the heartbeat thread (no retry), or the training thread (Heartbeat(), retried).
//               Reads info under `mu`; the call runs without it; its answer sets end and the
//               attempt / fence under `mu` (SetEnd, NoteAttempt, NoteRefusal).
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "worker/session/session_impl.h"

namespace latchkey {

absl::Status WorkerSession::Impl::HeartbeatOnce(bool retry) {
  const WorkerIdentity who = Identity();
  std::optional<RankPosition> position;
  if (opt.position) {
    position = opt.position();
    MeasureQuiet(&*position);
  }
  // The newest probe round (a recent one only), and whether this rank lacks the peer list.
  std::optional<Reachability> reach;
  bool want_peers = false;
  if (prober) {
    reach = prober->Latest(absl::Seconds(3));
    absl::MutexLock lock(&mu);
    want_peers = prober->peers_version() != peers_version || peers_version == 0;
  }
  const v1::HeartbeatRequest req =
      MakeHeartbeatRequest(who, Rank(), position ? &*position : nullptr, reach ? &*reach : nullptr,
                           want_peers, prober ? prober->port() : 0);
  v1::HeartbeatResponse resp;
  grpc::Status st;
  ClockProbe probe;
  if (retry) {
    (void)Retry([&](grpc::ClientContext* ctx) {
      probe.Start();
      st = HeartbeatStub()->Heartbeat(ctx, req, &resp);
      return st;
    });
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(GrpcDeadline(opt.rpc_timeout));
    probe.Start();
    st = HeartbeatStub()->Heartbeat(&ctx, req, &resp);
  }
  absl::Status s = FromGrpcStatus(st);
  if (s.ok()) {
    probe.Finish(resp.coordinator_unix_micros(), opt.clock_sample);
    const WorkerReply reply = FromProto(resp);
    SetEnd(reply.state, reply.reason);
    NoteAttempt(reply.attempt);
    int rank = -1;
    {
      absl::MutexLock lock(&mu);
      job_state = reply.state;
      peers_version = reply.peers.version;
      rank = info.rank;
      if (reply.stop) stop_heard = true;
    }
    if (prober && want_peers && !reply.peers.peers.empty()) prober->SetPeers(rank, reply.peers);
    if (reply.trace.id != 0 && reply.trace.id != trace_answered) AnswerTrace(reply.trace);
  } else {
    NoteRefusal(s, /*always=*/true, who.attempt);
  }
  return s;
}

void WorkerSession::Impl::AnswerTrace(const TraceAsk& ask) {
  trace_answered = ask.id;  // once, answered or not: the request has a deadline of its own
  if (!opt.trace) return;
  v1::PutTraceRequest req;
  *req.mutable_identity() = ToProto(Identity());
  req.set_rank(Rank());
  req.set_request_id(ask.id);
  req.set_jsonl(opt.trace(ask.first_step, ask.last_step, kMaxTraceUploadBytes));
  v1::PutTraceResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(opt.rpc_timeout));
  const grpc::Status st = stub->PutTrace(&ctx, req, &resp);
  if (!st.ok()) {
    std::fprintf(stderr, "latchkey-worker: rank %d: trace request %lld: %s\n", Rank(),
                 static_cast<long long>(ask.id), st.error_message().c_str());
  }
}

// The watchdog: a fenced session whose training thread never came back to recover is stuck
// where no error reaches it (a collective with a stopped peer).
void WorkerSession::Impl::CheckStuck() {
  if (opt.stuck_exit_after == absl::InfiniteDuration()) return;
  int rank = 0;
  int64_t mine = 0;
  int64_t theirs = 0;
  {
    absl::MutexLock lock(&mu);
    if (!fenced || recovering || end || closed) return;
    if (clock->Now() - fenced_since < opt.stuck_exit_after) return;
    rank = info.rank;
    mine = info.attempt;
    theirs = JobAttemptLocked();
  }
  const std::string where = opt.position ? WhereName(opt.position()) : "training";
  std::fprintf(stderr,
               "latchkey-worker: rank %d stuck in %s of attempt %lld while the job is at "
               "attempt %lld; exiting for a restart\n",
               rank, where.c_str(), static_cast<long long>(mine), static_cast<long long>(theirs));
  std::fflush(stderr);
  _exit(kExitRestartMe);
}

bool WorkerSession::Impl::SendLeave(int signal) {
  WorkerIdentity who = Identity();
  const v1::LeaveRequest req =
      MakeLeaveRequest(who, Rank(), signal == SIGINT ? "SIGINT" : "SIGTERM");
  v1::LeaveResponse resp;
  // One try with a second's deadline: without a coordinator there is no common stop to wait for.
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(absl::Seconds(1)));
  const grpc::Status st = stub->Leave(&ctx, req, &resp);
  if (!st.ok()) return false;
  const WorkerReply reply = FromProto(resp);
  NoteAttempt(reply.attempt);
  absl::MutexLock lock(&mu);
  stop_heard = stop_heard || reply.state == JobState::kRunning;
  return true;
}

void WorkerSession::Impl::CheckStopSignal() {
  if (opt.stop_signal == nullptr) return;
  const int signal = opt.stop_signal->load();
  if (signal == 0) return;
  const absl::Time now = clock->Now();
  if (signalled_at == absl::InfiniteFuture()) {
    signalled_at = now;
    std::fprintf(stderr,
                 "latchkey-worker: rank %d: %s: the attempt saves its last decided window and "
                 "stops; exiting within %s\n",
                 Rank(), signal == SIGINT ? "SIGINT" : "SIGTERM",
                 absl::FormatDuration(absl::Milliseconds(stop_grace_ms.load())).c_str());
    std::fflush(stderr);
  }
  if (!left_sent) {
    left_sent = SendLeave(signal);
    if (!left_sent) {
      // No coordinator to stop the attempt at a common window: no save can be agreed on, and
      // the process leaves now rather than at the grace (the job is recovered from as after a
      // crash once the coordinator is back).
      std::fprintf(stderr,
                   "latchkey-worker: rank %d: the coordinator did not answer the leave; exiting "
                   "without a save\n",
                   Rank());
      std::fflush(stderr);
      _exit(kExitPreempted);
    }
  }
  const absl::Duration grace = absl::Milliseconds(stop_grace_ms.load());
  if (now - signalled_at >= grace) {
    std::fprintf(stderr,
                 "latchkey-worker: rank %d: the grace of %s ran out before the save committed; "
                 "exiting (the previous checkpoint stays the newest)\n",
                 Rank(), absl::FormatDuration(grace).c_str());
    std::fflush(stderr);
    _exit(kExitPreempted);
  }
}

bool WorkerSession::Impl::SteerProber(const RankPosition* position) {
  if (!prober) return false;
  bool forming = false;
  {
    absl::MutexLock lock(&mu);
    forming = (job_state == JobState::kPending || job_state == JobState::kRecovering) &&
              !info.spare && info.rank >= 0 && !fenced && !end;
  }
  const bool stalling = position != nullptr && position->phase == RankPhase::kCollective &&
                        position->seconds >= absl::ToDoubleSeconds(opt.probe_after);
  prober->SetActive(forming || stalling);
  return forming || stalling;
}

void WorkerSession::Impl::MeasureQuiet(RankPosition* p) {
  if (!prober || p->phase != RankPhase::kCollective ||
      p->seconds < absl::ToDoubleSeconds(opt.probe_after)) {
    return;
  }
  const std::string key = absl::StrCat(p->attempt, "/", p->window, "/", p->seq);
  int port = 0;
  if (auto colon = opt.coordinator.rfind(':'); colon != std::string::npos) {
    port = std::atoi(opt.coordinator.c_str() + colon + 1);
  }
  const std::optional<uint64_t> bytes = prober->PeerBytes(port);
  if (!bytes) return;  // no connection to a peer's host: a collective over shared memory
  const absl::Time now = clock->Now();
  absl::MutexLock lock(&quiet_mu);
  if (key != quiet_key || *bytes != quiet_bytes) {
    // A new collective counts as moving from its start; then each change of the count.
    if (key != quiet_key) quiet_since = now - absl::Seconds(p->seconds);
    if (key == quiet_key) quiet_since = now;
    quiet_key = key;
    quiet_bytes = *bytes;
  }
  p->quiet_seconds = std::max(0.0, absl::ToDoubleSeconds(now - quiet_since));
}

// Heartbeats every `period`, and also as soon as the rank entered another window or attempt
// (checked every tick), so the coordinator's last view of a rank that goes silent is fresh.
void WorkerSession::Impl::HeartbeatLoop() {
  absl::Duration period = opt.heartbeat_interval;
  if (period <= absl::ZeroDuration()) {
    absl::MutexLock lock(&mu);
    period = info.heartbeat_interval;
  }
  period = std::max(absl::Milliseconds(50), period);
  // The watchdog and the position look more often than the heartbeat goes out.
  const absl::Duration tick = std::min(period, absl::Milliseconds(100));
  absl::Time next = clock->Now() + period;
  int64_t sent_window = -1;
  int64_t sent_attempt = 0;
  uint64_t sent_rounds = 0;
  absl::Time asked_peers = absl::InfinitePast();
  while (Sleep(tick)) {
    CheckStuck();
    bool moved = false;
    std::optional<RankPosition> p;
    if (opt.position) {
      p = opt.position();
      moved = p->window != sent_window || p->attempt != sent_attempt;
      sent_window = p->window;
      sent_attempt = p->attempt;
    }
    // Probing: a new round goes out at once; so does a request for a changed peer list while
    // the attempt forms (a few times a second at most).
    if (SteerProber(p ? &*p : nullptr)) {
      const uint64_t rounds = prober->rounds();
      bool lacks_peers = false;
      {
        absl::MutexLock lock(&mu);
        lacks_peers = prober->peers_version() != peers_version;
      }
      if (rounds != sent_rounds) moved = true;
      sent_rounds = rounds;
      if (lacks_peers && clock->Now() - asked_peers >= absl::Milliseconds(200)) {
        moved = true;
        asked_peers = clock->Now();
      }
    }
    if (!moved && clock->Now() < next) continue;
    next = clock->Now() + period;
    (void)HeartbeatOnce(/*retry=*/false);
  }
}

absl::Status WorkerSession::Heartbeat() { return impl_->HeartbeatOnce(/*retry=*/true); }

void WorkerSession::BeginRecovery() {
  absl::MutexLock lock(&impl_->mu);
  impl_->recovering = true;
}

}  // namespace latchkey
