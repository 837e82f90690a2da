#include "worker/comm/comm.h"

#include <cstring>

namespace latchkey::comm {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kBFloat16:
      return 2;
  }
  return 0;
}

Group::Group(std::string name, int rank, int size, std::shared_ptr<CollectiveStats> stats)
    : name_(std::move(name)), rank_(rank), size_(size), stats_(std::move(stats)) {}

std::chrono::milliseconds Group::Timeout(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : default_timeout_;
}

template <typename Fn>
absl::Status Group::Run(const char* op, size_t bytes, const CollectiveOptions& opts, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = fn();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!st.ok()) {
    return absl::Status(st.code(), std::string(op) + " on group '" + name_ + "' (rank " +
                                       std::to_string(rank_) + " of " + std::to_string(size_) +
                                       "): " + std::string(st.message()));
  }
  if (stats_) stats_->Record(op, name_, opts.tag, static_cast<int64_t>(bytes), seconds);
  return st;
}

absl::Status Group::AllReduceSum(void* data, size_t count, DataType type,
                                 const CollectiveOptions& opts) {
  if (type == DataType::kBFloat16) return absl::UnimplementedError("all_reduce of bf16");
  if (size_ <= 1 || count == 0) return absl::OkStatus();
  return Run("all_reduce", count * DataTypeSize(type), opts,
             [&] { return DoAllReduceSum(data, count, type, Timeout(opts)); });
}

absl::Status Group::AllGather(const void* in, void* out, size_t count, DataType type,
                              const CollectiveOptions& opts) {
  if (size_ <= 1) {
    if (count > 0 && in != out) std::memmove(out, in, count * DataTypeSize(type));
    return absl::OkStatus();
  }
  if (count == 0) return absl::OkStatus();
  return Run("all_gather", count * DataTypeSize(type), opts,
             [&] { return DoAllGather(in, out, count, type, Timeout(opts)); });
}

absl::Status Group::ReduceScatterSum(const void* in, void* out, size_t count, DataType type,
                                     const CollectiveOptions& opts) {
  if (type == DataType::kBFloat16) return absl::UnimplementedError("reduce_scatter of bf16");
  if (size_ <= 1) {
    if (count > 0 && in != out) std::memmove(out, in, count * DataTypeSize(type));
    return absl::OkStatus();
  }
  if (count == 0) return absl::OkStatus();
  return Run("reduce_scatter", count * size_ * DataTypeSize(type), opts,
             [&] { return DoReduceScatterSum(in, out, count, type, Timeout(opts)); });
}

absl::Status Group::Broadcast(void* data, size_t count, DataType type, int root,
                              const CollectiveOptions& opts) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError("broadcast root " + std::to_string(root) +
                                      " outside group '" + name_ + "' of size " +
                                      std::to_string(size_));
  }
  if (size_ <= 1 || count == 0) return absl::OkStatus();
  return Run("broadcast", count * DataTypeSize(type), opts,
             [&] { return DoBroadcast(data, count, type, root, Timeout(opts)); });
}

absl::Status Group::Barrier(const CollectiveOptions& opts) {
  if (size_ <= 1) return absl::OkStatus();
  return Run("barrier", 0, opts, [&] { return DoBarrier(Timeout(opts)); });
}

// SingleRankGroup: the public methods already return before reaching these.
absl::Status SingleRankGroup::DoAllReduceSum(void*, size_t, DataType, std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoAllGather(const void* in, void* out, size_t count, DataType type,
                                          std::chrono::milliseconds) {
  if (in != out) std::memcpy(out, in, count * DataTypeSize(type));
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoReduceScatterSum(const void* in, void* out, size_t count,
                                                 DataType type, std::chrono::milliseconds) {
  if (in != out) std::memcpy(out, in, count * DataTypeSize(type));
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoBroadcast(void*, size_t, DataType, int,
                                          std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoBarrier(std::chrono::milliseconds) { return absl::OkStatus(); }

}  // namespace latchkey::comm
