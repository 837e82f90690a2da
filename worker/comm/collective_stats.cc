#include "worker/comm/collective_stats.h"

namespace latchkey::comm {

void CollectiveStats::Record(const std::string& op, const std::string& group, const char* tag,
                             int64_t bytes, double seconds) {
  Listener listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveCounter& c = counters_[op + "/" + group];
    c.calls += 1;
    c.bytes += bytes;
    c.seconds += seconds;
    if (tag != nullptr) tagged_[tag] += 1;
    listener = listener_;
  }
  if (listener) listener(op, group, tag ? tag : "", bytes, seconds);
}

void CollectiveStats::SetListener(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

CollectiveStats::Counters CollectiveStats::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int64_t CollectiveStats::TaggedCalls(const std::string& tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tagged_.find(tag);
  return it == tagged_.end() ? 0 : it->second;
}

int64_t CollectiveStats::TotalCalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [key, c] : counters_) n += c.calls;
  return n;
}

CollectiveStats::Counters CollectiveStats::Delta(const Counters& now, const Counters& before) {
  Counters out;
  for (const auto& [key, c] : now) {
    CollectiveCounter d = c;
    auto it = before.find(key);
    if (it != before.end()) {
      d.calls -= it->second.calls;
      d.bytes -= it->second.bytes;
      d.seconds -= it->second.seconds;
    }
    if (d.calls != 0) out[key] = d;
  }
  return out;
}

}  // namespace latchkey::comm
