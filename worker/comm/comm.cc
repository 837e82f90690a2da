#include "worker/comm/comm.h"

#include <cstring>

#include "worker/device/cuda_runtime.h"

namespace latchkey::comm {
namespace {

// The shape checks shared by every collective: INVALID_ARGUMENT for buffers that do not fit.
absl::Status CheckPair(const Buffer& in, const Buffer& out, size_t in_count, size_t out_count) {
  if (in.type != out.type) {
    return absl::InvalidArgumentError(std::string("input is ") + DataTypeName(in.type) +
                                      " but output is " + DataTypeName(out.type));
  }
  if (in.device != out.device) {
    return absl::InvalidArgumentError("input is on " + in.device.ToString() + " but output on " +
                                      out.device.ToString());
  }
  if (in.count != in_count || out.count != out_count) {
    return absl::InvalidArgumentError(
        "input of " + std::to_string(in.count) + " and output of " + std::to_string(out.count) +
        " elements; expected " + std::to_string(in_count) + " and " + std::to_string(out_count));
  }
  return absl::OkStatus();
}

absl::Status CheckData(const Buffer& b) {
  if (b.data == nullptr && b.count > 0) {
    return absl::InvalidArgumentError("null buffer of " + std::to_string(b.count) + " elements");
  }
  return absl::OkStatus();
}

// Bytes (digests, ids) have no meaningful sum and bfloat16 has no reduction here: the sums
// refuse both before any check of their shape.
absl::Status CheckSummable(const char* op, DataType type) {
  if (type == DataType::kBFloat16) {
    return absl::UnimplementedError(std::string(op) + " of bfloat16");
  }
  if (type == DataType::kUInt8) {
    return absl::InvalidArgumentError(std::string(op) +
                                      " of uint8: bytes have no sum (all-gather them instead)");
  }
  return absl::OkStatus();
}

}  // namespace

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kBFloat16:
      return 2;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kUInt8:
      return "uint8";
  }
  return "?";
}

std::string Device::ToString() const {
  if (is_cpu()) return DeviceKindName(type);
  return std::string(DeviceKindName(type)) + ":" + std::to_string(index);
}

Buffer Buffer::Slice(size_t offset, size_t n) const {
  Buffer b = *this;
  b.data = static_cast<char*>(data) + offset * DataTypeSize(type);
  b.count = n;
  return b;
}

Buffer HostBuffer(float* data, size_t count) {
  return Buffer{data, count, DataType::kFloat32, Device::Cpu()};
}

Buffer HostBuffer(double* data, size_t count) {
  return Buffer{data, count, DataType::kFloat64, Device::Cpu()};
}

Buffer HostBuffer(uint8_t* data, size_t count) {
  return Buffer{data, count, DataType::kUInt8, Device::Cpu()};
}

Group::Group(std::string name, int rank, int size, Device device,
             std::shared_ptr<CollectiveStats> stats)
    : name_(std::move(name)), rank_(rank), size_(size), device_(device), stats_(std::move(stats)) {}

std::chrono::milliseconds Group::Timeout(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : default_timeout_;
}

absl::Status Group::Annotate(const char* op, const absl::Status& st) const {
  if (st.ok()) return st;
  return absl::Status(st.code(), std::string(op) + " on group '" + name_ + "' (rank " +
                                     std::to_string(rank_) + " of " + std::to_string(size_) +
                                     "): " + std::string(st.message()));
}

absl::Status Group::CheckDevice(const Device& device) const {
  if (device == device_) return absl::OkStatus();
  return absl::InvalidArgumentError(std::string("the ") + backend() + " backend takes " +
                                    device_.ToString() + " buffers only, not a " +
                                    device.ToString() + " buffer");
}

// A group copies the memory of the device it was formed for, and no other: the copy of another
// device's memory needs that device's runtime, which the group was not formed with.
absl::Status Group::CopyLocal(const Buffer& src, const Buffer& dst) {
  if (src.device != device_) {
    return absl::UnimplementedError("no local copy of " + src.device.ToString() +
                                    " memory in a group formed for " + device_.ToString());
  }
  if (src.device.is_cpu()) {
    std::memmove(dst.data, src.data, src.bytes());
    return absl::OkStatus();
  }
  return CopyOnCudaDevice(src.device.index, dst.data, src.data, src.bytes(), default_timeout());
}

template <typename Fn>
absl::Status Group::Run(const char* op, size_t bytes, const Device* device,
                        const CollectiveOptions& opts, Fn&& fn) {
  if (device != nullptr) {
    if (absl::Status st = CheckDevice(*device); !st.ok()) return Annotate(op, st);
  }
  if (recorder_) recorder_->EnterCollective(op, name_);
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = fn();
  if (recorder_) {
    recorder_->ExitCollective(static_cast<int64_t>(bytes),
                              opts.tag != nullptr && std::strcmp(opts.tag, kKvTag) == 0);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!st.ok()) return Annotate(op, st);
  if (stats_) stats_->Record(op, name_, opts.tag, static_cast<int64_t>(bytes), seconds);
  return st;
}

absl::Status Group::AllReduceSum(const Buffer& data, const CollectiveOptions& opts) {
  constexpr const char* kOp = "all_reduce";
  absl::Status st = CheckSummable(kOp, data.type);
  if (st.ok()) st = CheckData(data);
  if (!st.ok()) return Annotate(kOp, st);
  if (size_ <= 1 || data.count == 0) return absl::OkStatus();
  return Run(kOp, data.bytes(), &data.device, opts,
             [&] { return DoAllReduceSum(data, Timeout(opts)); });
}

absl::Status Group::AllGather(const Buffer& in, const Buffer& out, const CollectiveOptions& opts) {
  constexpr const char* kOp = "all_gather";
  absl::Status st = CheckPair(in, out, in.count, in.count * static_cast<size_t>(size_));
  if (st.ok()) st = CheckData(in);
  if (st.ok()) st = CheckData(out);
  if (!st.ok()) return Annotate(kOp, st);
  if (size_ <= 1) {
    if (in.count > 0 && in.data != out.data) return Annotate(kOp, CopyLocal(in, out));
    return absl::OkStatus();
  }
  if (in.count == 0) return absl::OkStatus();
  return Run(kOp, in.bytes(), &in.device, opts,
             [&] { return DoAllGather(in, out, Timeout(opts)); });
}

absl::Status Group::ReduceScatterSum(const Buffer& in, const Buffer& out,
                                     const CollectiveOptions& opts) {
  constexpr const char* kOp = "reduce_scatter";
  absl::Status st = CheckSummable(kOp, in.type);
  if (st.ok()) st = CheckPair(in, out, out.count * static_cast<size_t>(size_), out.count);
  if (st.ok()) st = CheckData(in);
  if (st.ok()) st = CheckData(out);
  if (!st.ok()) return Annotate(kOp, st);
  if (size_ <= 1) {
    if (out.count > 0 && in.data != out.data) return Annotate(kOp, CopyLocal(in, out));
    return absl::OkStatus();
  }
  if (out.count == 0) return absl::OkStatus();
  return Run(kOp, in.bytes(), &in.device, opts,
             [&] { return DoReduceScatterSum(in, out, Timeout(opts)); });
}

absl::Status Group::Broadcast(const Buffer& data, int root, const CollectiveOptions& opts) {
  constexpr const char* kOp = "broadcast";
  if (root < 0 || root >= size_) {
    return Annotate(
        kOp, absl::InvalidArgumentError("root " + std::to_string(root) + " outside the group"));
  }
  if (absl::Status st = CheckData(data); !st.ok()) return Annotate(kOp, st);
  if (size_ <= 1 || data.count == 0) return absl::OkStatus();
  return Run(kOp, data.bytes(), &data.device, opts,
             [&] { return DoBroadcast(data, root, Timeout(opts)); });
}

absl::Status Group::Barrier(const CollectiveOptions& opts) {
  if (size_ <= 1) return absl::OkStatus();
  return Run("barrier", 0, /*device=*/nullptr, opts, [&] { return DoBarrier(Timeout(opts)); });
}

namespace {
absl::Status NotIssued(const char* op) {
  return absl::InternalError(std::string(op) + " reached the backend of a group of one");
}
}  // namespace

absl::Status SingleRankGroup::DoAllReduceSum(const Buffer&, std::chrono::milliseconds) {
  return NotIssued("all_reduce");
}
absl::Status SingleRankGroup::DoAllGather(const Buffer&, const Buffer&, std::chrono::milliseconds) {
  return NotIssued("all_gather");
}
absl::Status SingleRankGroup::DoReduceScatterSum(const Buffer&, const Buffer&,
                                                 std::chrono::milliseconds) {
  return NotIssued("reduce_scatter");
}
absl::Status SingleRankGroup::DoBroadcast(const Buffer&, int, std::chrono::milliseconds) {
  return NotIssued("broadcast");
}
absl::Status SingleRankGroup::DoBarrier(std::chrono::milliseconds) { return NotIssued("barrier"); }

}  // namespace latchkey::comm
