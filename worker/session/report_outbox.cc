#include "worker/session/report_outbox.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace latchkey {

absl::Status ReportOutbox::Enqueue(Send send) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("report outbox closed");
  if (!error_.ok()) return error_;
  queue_.push_back(std::move(send));
  if (!sender_.joinable()) sender_ = std::thread([this] { SendLoop(); });
  cv_.SignalAll();
  return absl::OkStatus();
}

size_t ReportOutbox::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

absl::Status ReportOutbox::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status ReportOutbox::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (!queue_.empty() && error_.ok() && !closed_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!error_.ok()) return error_;
  if (!queue_.empty()) {
    return absl::UnavailableError(
        absl::StrCat(queue_.size(), queue_.size() == 1 ? " report" : " reports",
                     " not delivered within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

void ReportOutbox::Drop() {
  absl::MutexLock lock(&mu_);
  queue_.clear();
  error_ = absl::OkStatus();
  ++generation_;
  cv_.SignalAll();
}

void ReportOutbox::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
  }
  if (sender_.joinable()) sender_.join();
}

void ReportOutbox::SendLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (queue_.empty() && !closed_) cv_.Wait(&mu_);
    if (closed_) return;
    const Send send = queue_.front();
    const int64_t generation = generation_;
    mu_.Unlock();
    const absl::Status s = send();
    mu_.Lock();
    if (generation != generation_) continue;  // dropped meanwhile: the answer is moot
    if (s.ok()) {
      queue_.pop_front();
    } else {
      error_ = s;
      queue_.clear();
    }
    cv_.SignalAll();
  }
}

}  // namespace latchkey
