// bench_fleet's timer thread: runs callbacks at their time, one after another on one thread.
#ifndef LATCHKEY_BENCH_COORDINATOR_TIMERS_H_
#define LATCHKEY_BENCH_COORDINATOR_TIMERS_H_

#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace latchkey::bench {

// Runs callbacks at their time on one thread (heartbeats and the ends of compute phases).
// Thread-safety: At from any thread; a callback may call At.
class Timers {
 public:
  Timers() : thread_([this] { Loop(); }) {}
  ~Timers() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void At(absl::Time when, std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push(Entry{when, seq_++, std::move(fn)});
  }

 private:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto due = [this] {
          return stop_ || (!queue_.empty() && queue_.top().when <= absl::Now());
        };
        const absl::Time next =
            queue_.empty() ? absl::Now() + absl::Milliseconds(5) : queue_.top().when;
        mu_.AwaitWithDeadline(absl::Condition(&due), next);
        if (stop_) return;
        if (queue_.empty() || queue_.top().when > absl::Now()) continue;
        fn = std::move(const_cast<Entry&>(queue_.top()).fn);
        queue_.pop();
      }
      fn();
    }
  }
  absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_COORDINATOR_TIMERS_H_
