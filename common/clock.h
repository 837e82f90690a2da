// The time source of code whose behaviour depends on elapsed time (liveness deadlines, record
// timestamps), so tests can move time instead of sleeping.
//
//   Clock* clock = RealClock();        // absl::Now(); never deleted
//   ManualClock fake(absl::FromUnixSeconds(1000));
//   fake.Advance(absl::Seconds(31));   // everything reading `fake` sees the jump at once
//
// A Clock only tells the time: waiting (absl::CondVar, SleepFor) stays on the real clock, so code
// that blocks until a deadline measures that deadline with absl::Now().
//
// Thread-safety: every Clock is safe to call from any thread.
#ifndef LATCHKEY_COMMON_CLOCK_H_
#define LATCHKEY_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace latchkey {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The process's wall clock. Returns a process-wide instance the caller does not own.
Clock* RealClock();

// A clock that moves only when told to. For tests.
class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // REQUIRES: d >= 0 (time never runs backwards).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* RealClock() {
  class Real : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static Real* const clock = new Real();  // never destroyed: usable during static teardown
  return clock;
}

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_CLOCK_H_
