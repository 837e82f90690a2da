// Collective communication for latchkey's worker: one interface, one implementation per backend
// (Gloo on CPU now; a device backend slots in behind the same interface).
//
// Contract:
//  - A Group is a fixed set of ranks that issue the same collectives in the same order.
//  - A Group is formed for one device (device()): the CPU for gloo and shm, cuda:N for nccl, and
//    the rank's device for a group of one. Collectives take Buffers: typed, contiguous,
//    non-owning spans that say which device their memory is on. A buffer on another device than
//    the group's is refused (INVALID_ARGUMENT, naming both) before anything is issued. Buffers
//    whose types, counts or devices do not fit together are INVALID_ARGUMENT as well.
//  - kUInt8 buffers are bytes (digests, ids): every backend all-gathers and broadcasts them; a
//    sum of bytes means nothing, so all-reduce and reduce-scatter refuse them INVALID_ARGUMENT.
//    kBFloat16 moves unreduced as well (its reductions are UNIMPLEMENTED).
//  - Every collective blocks until done or until its timeout (CollectiveOptions::timeout, default
//    kDefaultCollectiveTimeout) and returns DEADLINE_EXCEEDED / UNAVAILABLE instead of hanging.
//  - Every collective that runs goes through Group's public methods, which count it (op, group,
//    bytes, seconds, tag) in the process-wide CollectiveStats. Counts are therefore observed, never
//    derived from a formula. Refused and failed collectives are not counted.
//  - A group of size 1 is not parallel: its collectives issue and count nothing (all-gather and
//    reduce-scatter copy `in` to `out` when they differ, on the group's device). Every group of
//    one is a SingleRankGroup, whatever the backend. Callers should test is_parallel() first (no
//    flatten/copy work either).
// This header is torch-free: callers holding tensors build Buffers from them
// (worker/model/comm_buffer.h).
// Thread-safety: a Group is used by one thread at a time (the training thread).
#ifndef LATCHKEY_WORKER_COMM_COMM_H_
#define LATCHKEY_WORKER_COMM_COMM_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/backend.h"
#include "common/timeouts.h"
#include "worker/comm/collective_stats.h"
#include "worker/comm/flight_recorder.h"

namespace latchkey::comm {

inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{
    latchkey::kDefaultCollectiveTimeout};

// kBFloat16 travels as raw 16-bit words and kUInt8 as raw bytes: all-gather and broadcast only
// (no reductions).
enum class DataType { kFloat32, kFloat64, kBFloat16, kUInt8 };
size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);  // "float32", "float64", "bfloat16", "uint8"

// Where a buffer's memory lives (the spec's latchkey.device kinds, common/backend.h).
struct Device {
  DeviceKind type = DeviceKind::kCpu;
  int index = -1;  // the CUDA ordinal; -1 for the CPU

  static constexpr Device Cpu() { return Device{}; }
  static constexpr Device Cuda(int index) { return Device{DeviceKind::kCuda, index}; }
  bool is_cpu() const { return type == DeviceKind::kCpu; }
  std::string ToString() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// `count` contiguous elements of `type` at `data`, on `device` (device memory when it is not the
// CPU: comm never dereferences such a pointer itself). Non-owning: the memory must stay valid
// until the collective returns.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  Device device;

  size_t bytes() const { return count * DataTypeSize(type); }
  // Elements [offset, offset + n) of this buffer. REQUIRES: offset + n <= count.
  Buffer Slice(size_t offset, size_t n) const;
};

// Buffers over host memory.
Buffer HostBuffer(float* data, size_t count);
Buffer HostBuffer(double* data, size_t count);
Buffer HostBuffer(uint8_t* data, size_t count);

struct CollectiveOptions {
  // 0 = the group's default timeout (kDefaultCollectiveTimeout unless set_default_timeout).
  std::chrono::milliseconds timeout{0};
  // Counted separately under this tag as well (e.g. kKvTag for the replicated K/V reduction).
  const char* tag = nullptr;
};

inline constexpr const char* kKvTag = "kv";

// How backends tell a timeout from a broken connection when the library they wrap reports both
// as the same exception: a failure raised once (about) the call's whole timeout has elapsed is
// the deadline (DEADLINE_EXCEEDED), one raised earlier is a lost peer (UNAVAILABLE). Libraries
// check their own deadlines a little early or late, so 90% of the timeout counts as reached.
inline bool DeadlineReached(std::chrono::steady_clock::duration elapsed,
                            std::chrono::milliseconds timeout) {
  return elapsed >= timeout * 9 / 10;
}

class Group {
 public:
  // A group of `size` ranks whose buffers live on `device`.
  Group(std::string name, int rank, int size, Device device,
        std::shared_ptr<CollectiveStats> stats);
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const Device& device() const { return device_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) { default_timeout_ = t; }
  // Every collective issued on a parallel group is marked here (entry and exit); null: none.
  void set_recorder(std::shared_ptr<FlightRecorder> recorder) { recorder_ = std::move(recorder); }

  // In-place sum over the group of `data`.
  absl::Status AllReduceSum(const Buffer& data, const CollectiveOptions& opts = {});
  // out[r*n, (r+1)*n) receives rank r's `in` (n = in.count). REQUIRES: out.count == size()*n,
  // same type and device. In place (no copy) when `in` is this rank's chunk of `out`.
  absl::Status AllGather(const Buffer& in, const Buffer& out, const CollectiveOptions& opts = {});
  // `out` (n = out.count elements) receives the sum over ranks of chunk rank() of `in`.
  // REQUIRES: in.count == size()*n, same type and device. In place when `out` is this rank's
  // chunk of `in`: `in` is then used as scratch (its other chunks are clobbered) and no copy of
  // it is made.
  absl::Status ReduceScatterSum(const Buffer& in, const Buffer& out,
                                const CollectiveOptions& opts = {});
  absl::Status Broadcast(const Buffer& data, int root, const CollectiveOptions& opts = {});
  absl::Status Barrier(const CollectiveOptions& opts = {});

 protected:
  // The backend's half. Called only for a parallel group, with validated buffers (types and
  // counts fit, all on device()) of nonzero count; never with kUInt8 for the sums.
  virtual absl::Status DoAllReduceSum(const Buffer& data, std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoAllGather(const Buffer& in, const Buffer& out,
                                   std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                          std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoBroadcast(const Buffer& data, int root,
                                   std::chrono::milliseconds timeout) = 0;
  virtual absl::Status DoBarrier(std::chrono::milliseconds timeout) = 0;
  // The backend's name in errors: "gloo", "shm", "nccl"; "single-rank" for a group of one.
  virtual const char* backend() const = 0;
  // OK when `device` is this group's device(); otherwise INVALID_ARGUMENT, e.g. "the shm backend
  // takes cpu buffers only, not a cuda:0 buffer".
  absl::Status CheckDevice(const Device& device) const;
  // The single-rank copy of `src` into `dst` (same bytes; they may overlap); UNIMPLEMENTED,
  // naming the device, when `src` is not on device(). The default copies host memory (memmove)
  // or memory of cuda:N (the CUDA runtime's copy, waited for within default_timeout()); a
  // backend with its own stream overrides it.
  virtual absl::Status CopyLocal(const Buffer& src, const Buffer& dst);

 private:
  std::chrono::milliseconds Timeout(const CollectiveOptions& opts) const;
  absl::Status Annotate(const char* op, const absl::Status& st) const;
  // Checks `device` (null: the collective moves no buffer), runs fn, annotates and counts.
  template <typename Fn>
  absl::Status Run(const char* op, size_t bytes, const Device* device,
                   const CollectiveOptions& opts, Fn&& fn);

  std::string name_;
  int rank_;
  int size_;
  Device device_;
  std::shared_ptr<CollectiveStats> stats_;
  std::chrono::milliseconds default_timeout_ = kDefaultCollectiveTimeout;
  std::shared_ptr<FlightRecorder> recorder_;
};

// The is_parallel predicate: false for an absent dimension (null) and for a single-rank group.
inline bool is_parallel(const Group* g) { return g != nullptr && g->size() > 1; }
inline bool is_parallel(const std::shared_ptr<Group>& g) { return is_parallel(g.get()); }

// A group with one member, on `device`: every dimension of size 1 (and every group of a world
// of one), whatever the backend. Never issues anything; its local copies are Group's.
class SingleRankGroup final : public Group {
 public:
  SingleRankGroup(std::string name, Device device, std::shared_ptr<CollectiveStats> stats)
      : Group(std::move(name), 0, 1, device, std::move(stats)) {}

 protected:
  const char* backend() const override { return "single-rank"; }
  // Never called: Group's public methods return before reaching a single rank's backend. Each
  // fails INTERNAL should that ever change.
  absl::Status DoAllReduceSum(const Buffer&, std::chrono::milliseconds) override;
  absl::Status DoAllGather(const Buffer&, const Buffer&, std::chrono::milliseconds) override;
  absl::Status DoReduceScatterSum(const Buffer&, const Buffer&, std::chrono::milliseconds) override;
  absl::Status DoBroadcast(const Buffer&, int, std::chrono::milliseconds) override;
  absl::Status DoBarrier(std::chrono::milliseconds) override;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_COMM_H_
