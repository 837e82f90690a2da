// The time source of code whose behaviour depends on elapsed time (liveness deadlines, record
// timestamps), so tests can move time instead of sleeping.
//
//   Clock* clock = RealClock();        // absl::Now(); never deleted
//   ManualClock fake(absl::FromUnixSeconds(1000));
//   fake.Advance(absl::Seconds(31));   // everything reading `fake` sees the jump at once
//
// Code that waits for a deadline on a Clock waits with WaitUntil (below): on the real clock that
// is one absl::CondVar wait; on a ManualClock the wait wakes every kManualClockPoll of real time
// to look at the clock again, so a test's Advance ends it at once. (The coordinator's Wait*
// calls wait on real time: their deadlines are absl::Now()'s.)
//
// Thread-safety: every Clock is safe to call from any thread.
#ifndef LATCHKEY_COMMON_CLOCK_H_
#define LATCHKEY_COMMON_CLOCK_H_

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace latchkey {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // When, on the real clock (absl::Now()), a wait for `deadline` on this clock should wake up to
  // look again. The real clock: the deadline itself.
  virtual absl::Time WakeTime(absl::Time deadline) const { return deadline; }
};

// How often a wait on a ManualClock looks at it (real time).
inline constexpr absl::Duration kManualClockPoll = absl::Milliseconds(5);

// Waits on `cv` (`mu` held) until signalled, or until `deadline` passed on `clock`; may return
// early (as CondVar waits do): callers loop on their condition and on clock.Now() < deadline.
inline void WaitUntil(absl::CondVar& cv, absl::Mutex& mu, const Clock& clock, absl::Time deadline)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  cv.WaitWithDeadline(&mu, clock.WakeTime(deadline));
}

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
  absl::Time WakeTime(absl::Time deadline) const override {
    const absl::Duration left = deadline - Now();
    return absl::Now() + std::min(std::max(left, absl::ZeroDuration()), kManualClockPoll);
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
