// Timeline: where this rank has been, as the flight recorder (flight_recorder.h) says where it is
// now. A bounded ring of spans (a window, a micro-batch's data, forward and backward, each
// collective with its op, group, bytes and sequence number, the latch wait, the boundary, the
// optimizer step, eval, a checkpoint's stage, write and commit), timed on the process's steady
// clock, and the best measurement of the coordinator's clock against it, so that every rank's
// spans land on one time axis (docs/observability.md "Traces").
//
// When the ring is full the oldest span gives way (dropped() counts them). Capacity 0 records
// nothing: every call returns at once.
//
// Thread-safety: every method is thread-safe (the training thread and the checkpoint writer add
// spans; the process's exit reads them).
#ifndef LATCHKEY_WORKER_COMM_TIMELINE_H_
#define LATCHKEY_WORKER_COMM_TIMELINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace latchkey::comm {

enum class SpanKind : uint8_t {
  kWindow,      // latch wait .. the step's report
  kLatchWait,   // waiting for the window's latch
  kMicroBatch,  // one micro-batch: data, forward, backward and its per-micro-batch reductions
  kData,        // reading the micro-batch's samples
  kForward,
  kBackward,
  kBoundary,   // the window's boundary reduction (grad_sync Finish)
  kOptimizer,  // clip, step, and ZeRO's gather
  kEval,
  kCheckpoint,        // the window's checkpoint stage on the training thread (stage or save)
  kCheckpointWrite,   // the background write of an asynchronous save
  kCheckpointCommit,  // the commit
  kCollective,
};
const char* SpanKindName(SpanKind kind);

// The stream a span is drawn on: a thread of the trace.
enum class SpanStream : uint8_t { kTrain = 1, kCollectives = 2, kCheckpoint = 3 };
SpanStream StreamOf(SpanKind kind);
const char* SpanStreamName(SpanStream stream);

struct Span {
  int64_t begin_us = 0;  // steady clock, microseconds
  int64_t end_us = 0;
  int64_t step = -1;
  int64_t bytes = 0;  // collectives
  int64_t seq = 0;    // collectives: the window's collective number (1-based)
  int32_t micro_batch = -1;
  int16_t group = -1;        // collectives: index of the group's name (Timeline::GroupName)
  const char* op = nullptr;  // collectives: a string literal ("all_reduce")
  SpanKind kind = SpanKind::kWindow;
  bool kv = false;  // a K/V reduction (the collective's tag is "kv")
};

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kDefaultCapacity = 1 << 16;

  explicit Timeline(size_t capacity = kDefaultCapacity);

  bool enabled() const { return capacity_ > 0; }
  static int64_t NowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
        .count();
  }

  void Add(const Span& span);
  // The index of a group's name (interned once; a process has a handful).
  int16_t GroupIndex(const std::string& name);

  // A measurement of the coordinator's clock: its Unix microseconds minus the steady clock at
  // the call's midpoint, within `error_micros`. The sample with the smallest error is kept (a
  // newer one replaces it after a minute, bounding drift).
  void NoteClock(int64_t offset_micros, int64_t error_micros);

  // What a dump carries: the spans in order of their end, oldest first, and the clock.
  struct Contents {
    std::vector<Span> spans;
    std::vector<std::string> groups;
    int64_t offset_micros = 0;  // add to a span's steady time: Unix microseconds
    int64_t error_micros = -1;  // -1: no coordinator sample (this host's clock, error unknown)
    int64_t dropped = 0;
  };
  Contents Read() const;

  // Who the spans are of: the members a dump's header starts with (rank, world size, attempt,
  // backend, ...; an object). The runner sets it as each attempt begins.
  void SetIdentity(const nlohmann::ordered_json& identity);

  // Appends the contents as JSON lines: a header (the identity, then the clock's members and
  // the span count), then one object per span, its times on the coordinator's clock (Unix
  // microseconds). docs/observability.md "Traces" has the fields.
  void WriteJsonl(std::ostream& out) const;
  // The same as a string, for the spans of steps first_step..last_step (-1: no bound) only, at
  // most `max_bytes` in all: when they do not fit, the newest spans are kept and the header's
  // "dropped" counts the others too.
  std::string Jsonl(int64_t first_step = 0, int64_t last_step = -1,
                    size_t max_bytes = SIZE_MAX) const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<Span> ring_;  // GUARDED_BY(mu_): ring_[ (next_ - count) .. next_ ) mod capacity
  size_t next_ = 0;         // GUARDED_BY(mu_)
  size_t count_ = 0;        // GUARDED_BY(mu_)
  int64_t dropped_ = 0;     // GUARDED_BY(mu_)
  std::vector<std::string> groups_;  // GUARDED_BY(mu_)
  int64_t offset_micros_ = 0;        // GUARDED_BY(mu_)
  int64_t error_micros_ = -1;        // GUARDED_BY(mu_)
  int64_t sampled_at_ = 0;           // GUARDED_BY(mu_): steady micros of the kept sample
  std::string identity_ = "{}";      // GUARDED_BY(mu_): a JSON object
};

// Adds a span of `kind` from construction to destruction. A null or disabled timeline: nothing.
class ScopedSpan {
 public:
  ScopedSpan(Timeline* timeline, SpanKind kind, int64_t step, int micro_batch = -1)
      : timeline_(timeline != nullptr && timeline->enabled() ? timeline : nullptr) {
    if (timeline_ == nullptr) return;
    span_.kind = kind;
    span_.step = step;
    span_.micro_batch = micro_batch;
    span_.begin_us = Timeline::NowMicros();
  }
  ~ScopedSpan() { End(); }
  // Ends the span now (the destructor then does nothing).
  void End() {
    if (timeline_ == nullptr) return;
    span_.end_us = Timeline::NowMicros();
    timeline_->Add(span_);
    timeline_ = nullptr;
  }
  // Drops the span (nothing happened worth drawing).
  void Cancel() { timeline_ = nullptr; }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  Timeline* timeline_;
  Span span_;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_TIMELINE_H_
