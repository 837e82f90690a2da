// ReportOutbox: the reports a worker could not deliver when it made them (the coordinator down,
// restarting, unreachable), sent in order by a thread of its own so that training goes on
// through the outage (docs/fault-tolerance.md). Each entry is a call that retries by itself
// (WorkerSession's Report: capped exponential backoff up to the reconnect timeout) and returns
// its final status; an entry leaves the queue only once delivered. A failed entry empties the
// queue and becomes error() until Drop(). Drop() (a new attempt) forgets everything queued;
// the answer of an entry in flight across a Drop() is ignored.
// Thread-safety: every method is thread-safe. The destructor calls Close().
#ifndef LATCHKEY_WORKER_SESSION_REPORT_OUTBOX_H_
#define LATCHKEY_WORKER_SESSION_REPORT_OUTBOX_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace latchkey {

class ReportOutbox {
 public:
  using Send = std::function<absl::Status()>;

  ReportOutbox() = default;
  ~ReportOutbox() { Close(); }
  ReportOutbox(const ReportOutbox&) = delete;
  ReportOutbox& operator=(const ReportOutbox&) = delete;

  // Queues `send` behind what is queued (starting the sender thread on first use). OK, or the
  // error of an earlier entry (nothing queued then), or FAILED_PRECONDITION after Close().
  absl::Status Enqueue(Send send);
  // Entries not yet delivered (the one in flight included).
  size_t pending() const;
  // The failure of a queued entry, OK while there is none.
  absl::Status error() const;
  // Waits (real time) up to `timeout` until nothing is pending or an entry failed; error(), or
  // UNAVAILABLE naming what is still pending, or OK.
  absl::Status Flush(absl::Duration timeout);
  // Forgets the queue and the error.
  void Drop();
  // Stops the sender thread (an entry in flight finishes first: its call ends when the session
  // that made it is closed); what is pending is not sent.
  void Close();

 private:
  void SendLoop();

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Send> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Drop()
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sender_;  // started under mu_, joined by Close()
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_REPORT_OUTBOX_H_
