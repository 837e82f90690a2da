// FlightRecorder: where this rank is right now (common/rank_position.h), kept current by the
// runner (latch waits, checkpoints), the engine (window, micro-batch, compute, eval) and every
// collective (comm::Group marks entry and exit), and read by the heartbeat thread, which sends it
// to the coordinator: a live flight recorder, so a hang is named while it happens.
//
// Each setter starts a new position (its clock restarts); Snapshot() says how long the rank has
// been there. The collective sequence number counts the collectives entered in the window.
//
// Thread-safety: every method is thread-safe (one writer, the training thread, and readers).
#ifndef LATCHKEY_WORKER_COMM_FLIGHT_RECORDER_H_
#define LATCHKEY_WORKER_COMM_FLIGHT_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/rank_position.h"
#include "worker/comm/timeline.h"

namespace latchkey::comm {

class FlightRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // `span_capacity`: the timeline's ring (0: no timeline).
  explicit FlightRecorder(size_t span_capacity = Timeline::kDefaultCapacity)
      : timeline_(span_capacity) {}

  Timeline* timeline() { return &timeline_; }

  void SetAttempt(int64_t attempt) {
    std::lock_guard<std::mutex> lock(mu_);
    pos_.attempt = attempt;
  }
  // A new window: micro-batch -1, sequence 0, phase `phase` (kLatch while its latch is awaited).
  void BeginWindow(int64_t window, RankPhase phase) {
    std::lock_guard<std::mutex> lock(mu_);
    pos_.window = window;
    pos_.micro_batch = -1;
    pos_.seq = 0;
    MoveLocked(phase);
  }
  void SetMicroBatch(int micro_batch) {
    std::lock_guard<std::mutex> lock(mu_);
    pos_.micro_batch = micro_batch;
    MoveLocked(RankPhase::kCompute);
  }
  // kCompute, kEval, kCheckpoint, kLatch, kIdle (not kCollective: see EnterCollective).
  void SetPhase(RankPhase phase) {
    std::lock_guard<std::mutex> lock(mu_);
    MoveLocked(phase);
  }
  // Called by comm::Group around every collective it issues; `op` is a string literal.
  void EnterCollective(const char* op, const std::string& group) {
    const int16_t group_index = timeline_.enabled() ? timeline_.GroupIndex(group) : -1;
    std::lock_guard<std::mutex> lock(mu_);
    outer_ = pos_.phase;
    pos_.op = op;
    pos_.group = group;
    ++pos_.seq;
    MoveLocked(RankPhase::kCollective);
    collective_ = Span{};
    collective_.kind = SpanKind::kCollective;
    collective_.begin_us = Timeline::NowMicros();
    collective_.step = pos_.window;
    collective_.micro_batch = pos_.micro_batch;
    collective_.seq = pos_.seq;
    collective_.op = op;
    collective_.group = group_index;
  }
  // `bytes`: the collective's payload; `kv`: a K/V reduction.
  void ExitCollective(int64_t bytes, bool kv) {
    std::lock_guard<std::mutex> lock(mu_);
    MoveLocked(outer_);
    if (!timeline_.enabled()) return;
    collective_.end_us = Timeline::NowMicros();
    collective_.bytes = bytes;
    collective_.kv = kv;
    timeline_.Add(collective_);
  }

  RankPosition Snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    RankPosition p = pos_;
    p.seconds = std::chrono::duration<double>(Clock::now() - since_).count();
    return p;
  }

 private:
  void MoveLocked(RankPhase phase) {
    pos_.phase = phase;
    since_ = Clock::now();
  }

  mutable std::mutex mu_;
  RankPosition pos_;                        // GUARDED_BY(mu_)
  RankPhase outer_ = RankPhase::kIdle;      // GUARDED_BY(mu_): the phase a collective returns to
  Clock::time_point since_ = Clock::now();  // GUARDED_BY(mu_)
  Span collective_;                         // GUARDED_BY(mu_): the collective entered last
  Timeline timeline_;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_FLIGHT_RECORDER_H_
