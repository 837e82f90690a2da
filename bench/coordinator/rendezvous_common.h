// Pieces bench_rendezvous's parent and its child processes share: a latency histogram that
// merges across processes (text lines), the address each simulated rank publishes, and the
// per-rank timeline a child reports.
#ifndef LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_COMMON_H_
#define LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_COMMON_H_

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace latchkey::bench {

// Log-spaced microsecond buckets (2% wide): quantiles within 2% whatever the spread.
class LatencyHist {
 public:
  static constexpr int kBuckets = 1400;  // 1.02^1400 us: far past any timeout
  LatencyHist() : n_(kBuckets, 0) {}
  void Add(double us) { n_[Bucket(us)]++; }
  void Add(int bucket, uint64_t count) { n_[std::clamp(bucket, 0, kBuckets - 1)] += count; }
  void Merge(const LatencyHist& o) {
    for (int i = 0; i < kBuckets; ++i) n_[i] += o.n_[i];
  }
  uint64_t count() const {
    uint64_t c = 0;
    for (uint64_t x : n_) c += x;
    return c;
  }
  // The quantile's bucket midpoint, in milliseconds; 0 when empty.
  double QuantileMs(double q) const {
    const uint64_t total = count();
    if (total == 0) return 0;
    const auto want = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += n_[i];
      if (seen >= std::max<uint64_t>(want, 1)) return std::pow(1.02, i + 0.5) / 1000.0;
    }
    return 0;
  }
  // "h <op> <bucket> <count>" per non-empty bucket.
  std::string Lines(const std::string& op) const {
    std::string out;
    for (int i = 0; i < kBuckets; ++i) {
      if (n_[i] != 0) out += absl::StrFormat("h %s %d %u\n", op, i, n_[i]);
    }
    return out;
  }

 private:
  static int Bucket(double us) {
    if (us <= 1) return 0;
    return std::min(kBuckets - 1, static_cast<int>(std::log(us) / std::log(1.02)));
  }
  std::vector<uint64_t> n_;
};

// The address rank `rank` publishes: distinct per rank, computable by every reader.
inline std::string RankAddress(int rank) {
  return absl::StrFormat("10.%d.%d.%d:%d", (rank >> 16) & 255, (rank >> 8) & 255, rank & 255,
                         20000 + rank % 40000);
}

// One rank's timeline (CLOCK_REALTIME ns, shared by every process of this machine).
struct RankTimes {
  int64_t start_ns = 0;      // before it connected to the store (or joined the coordinator)
  int64_t connected_ns = 0;  // connected (and joined)
  int64_t done_ns = 0;       // read and checked everything it needs
  bool ok = false;
};

// Raise the descriptor limit to the hard limit: every simulated rank holds sockets (the c10d
// client opens two per store connection), the store's host one per client socket.
inline void RaiseFdLimit() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
}

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_COMMON_H_
