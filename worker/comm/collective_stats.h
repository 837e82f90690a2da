// Process-wide counters of every collective issued through comm::Group: one place that observes
// them all. Also feeds per-step deltas (JSONL) and, through a listener, Prometheus.
// Thread-safety: all methods are thread-safe.
#ifndef LATCHKEY_WORKER_COMM_COLLECTIVE_STATS_H_
#define LATCHKEY_WORKER_COMM_COLLECTIVE_STATS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace latchkey::comm {

struct CollectiveCounter {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0.0;
};

class CollectiveStats {
 public:
  // Key "op/group", e.g. "all_reduce/tp".
  using Counters = std::map<std::string, CollectiveCounter>;
  // Called after every recorded collective (op, group, tag or "", bytes, seconds).
  using Listener = std::function<void(const std::string& op, const std::string& group,
                                      const std::string& tag, int64_t bytes, double seconds)>;

  void Record(const std::string& op, const std::string& group, const char* tag, int64_t bytes,
              double seconds);
  void SetListener(Listener listener);

  Counters Snapshot() const;
  // Calls of collectives carrying `tag` (e.g. "kv"), all ops and groups.
  int64_t TaggedCalls(const std::string& tag) const;
  int64_t TotalCalls() const;

  // Difference of two snapshots (entries with zero calls dropped).
  static Counters Delta(const Counters& now, const Counters& before);

 private:
  mutable std::mutex mu_;
  Counters counters_;                      // GUARDED_BY(mu_)
  std::map<std::string, int64_t> tagged_;  // GUARDED_BY(mu_)
  Listener listener_;                      // GUARDED_BY(mu_)
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_COLLECTIVE_STATS_H_
