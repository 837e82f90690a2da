// Collective communication for latchkey's worker: one interface, one implementation per backend
// (Gloo on CPU now; NCCL slots in behind the same interface).
//
// Contract:
//  - A Group is a fixed set of ranks that issue the same collectives in the same order.
//  - Every collective blocks until done or until its timeout (CollectiveOptions::timeout, default
//    kDefaultCollectiveTimeout) and returns DEADLINE_EXCEEDED / UNAVAILABLE instead of hanging.
//  - Every collective that runs goes through Group's public methods, which count it (op, group,
//    bytes, seconds, tag) in the process-wide CollectiveStats. Counts are therefore observed, never
//    derived from a formula.
//  - A group of size 1 is not parallel: its collectives are no-ops that issue and count nothing.
//    Callers should test is_parallel() first (no flatten/copy work either).
// Thread-safety: a Group is used by one thread at a time (the training thread).
#ifndef LATCHKEY_WORKER_COMM_COMM_H_
#define LATCHKEY_WORKER_COMM_COMM_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/timeouts.h"
#include "worker/comm/collective_stats.h"

namespace latchkey::comm {

inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{latchkey::kDefaultCollectiveTimeout};

// kBFloat16 travels as raw 16-bit words: all-gather and broadcast only (no reductions).
enum class DataType { kFloat32, kFloat64, kBFloat16 };
size_t DataTypeSize(DataType t);

struct CollectiveOptions {
  // 0 = the group's default timeout (kDefaultCollectiveTimeout unless set_default_timeout).
  std::chrono::milliseconds timeout{0};
  // Counted separately under this tag as well (e.g. kKvTag for the replicated K/V reduction).
  const char* tag = nullptr;
};

inline constexpr const char* kKvTag = "kv";

class Group {
 public:
  Group(std::string name, int rank, int size, std::shared_ptr<CollectiveStats> stats);
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) { default_timeout_ = t; }

  // In-place sum over the group of data[0, count).
  absl::Status AllReduceSum(void* data, size_t count, DataType type,
                            const CollectiveOptions& opts = {});
  // out[r*count, (r+1)*count) receives rank r's in[0, count). `out` holds size()*count elements.
  // In place (no copy) when `in` is this rank's chunk of `out`.
  absl::Status AllGather(const void* in, void* out, size_t count, DataType type,
                         const CollectiveOptions& opts = {});
  // `in` holds size()*count elements; out[0, count) receives the sum over ranks of chunk rank().
  // In place when `out` is this rank's chunk of `in`: `in` is then used as scratch (its other
  // chunks are clobbered) and no copy of it is made.
  absl::Status ReduceScatterSum(const void* in, void* out, size_t count, DataType type,
                                const CollectiveOptions& opts = {});
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         const CollectiveOptions& opts = {});
  absl::Status Barrier(const CollectiveOptions& opts = {});

 protected:
  virtual absl::Status DoAllReduceSum(void* data, size_t count, DataType type,
                                      std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoAllGather(const void* in, void* out, size_t count, DataType type,
                                   std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoReduceScatterSum(const void* in, void* out, size_t count, DataType type,
                                          std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoBroadcast(void* data, size_t count, DataType type, int root,
                                   std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoBarrier(std::chrono::milliseconds timeout) = 0;

 private:
  std::chrono::milliseconds Timeout(const CollectiveOptions& opts) const;
  template <typename Fn>
  absl::Status Run(const char* op, size_t bytes, const CollectiveOptions& opts, Fn&& fn);

  std::string name_;
  int rank_;
  int size_;
  std::shared_ptr<CollectiveStats> stats_;
  std::chrono::milliseconds default_timeout_ = kDefaultCollectiveTimeout;
};

// The is_parallel predicate: false for an absent dimension (null) and for a single-rank group.
inline bool is_parallel(const Group* g) { return g != nullptr && g->size() > 1; }
inline bool is_parallel(const std::shared_ptr<Group>& g) { return is_parallel(g.get()); }

// A group with one member. Never issues anything.
class SingleRankGroup final : public Group {
 public:
  SingleRankGroup(std::string name, std::shared_ptr<CollectiveStats> stats)
      : Group(std::move(name), 0, 1, std::move(stats)) {}

 protected:
  absl::Status DoAllReduceSum(void*, size_t, DataType, std::chrono::milliseconds) override;
  absl::Status DoAllGather(const void* in, void* out, size_t count, DataType type,
                           std::chrono::milliseconds) override;
  absl::Status DoReduceScatterSum(const void* in, void* out, size_t count, DataType type,
                                  std::chrono::milliseconds) override;
  absl::Status DoBroadcast(void*, size_t, DataType, int, std::chrono::milliseconds) override;
  absl::Status DoBarrier(std::chrono::milliseconds) override;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_COMM_H_
