#include "worker/comm/comm.h"

#include <cstring>

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

}  // namespace

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

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

std::string Device::ToString() const {
  if (type == DeviceType::kCpu) return "cpu";
  return "cuda:" + std::to_string(index);
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

Group::Group(std::string name, int rank, int size, std::shared_ptr<CollectiveStats> stats)
    : name_(std::move(name)), rank_(rank), size_(size), stats_(std::move(stats)) {}

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
  if (device.is_cpu()) return absl::OkStatus();
  return absl::InvalidArgumentError("this group takes cpu buffers only, not " + device.ToString());
}

absl::Status Group::CopyLocal(const Buffer& src, const Buffer& dst) {
  if (!src.device.is_cpu()) {
    return absl::UnimplementedError("no local copy of " + src.device.ToString() +
                                    " memory in this group's backend");
  }
  std::memmove(dst.data, src.data, src.bytes());
  return absl::OkStatus();
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
  if (recorder_) recorder_->ExitCollective();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!st.ok()) return Annotate(op, st);
  if (stats_) stats_->Record(op, name_, opts.tag, static_cast<int64_t>(bytes), seconds);
  return st;
}

absl::Status Group::AllReduceSum(const Buffer& data, const CollectiveOptions& opts) {
  constexpr const char* kOp = "all_reduce";
  if (data.type == DataType::kBFloat16) {
    return Annotate(kOp, absl::UnimplementedError("all_reduce of bfloat16"));
  }
  if (absl::Status st = CheckData(data); !st.ok()) return Annotate(kOp, st);
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
  if (in.type == DataType::kBFloat16) {
    return Annotate(kOp, absl::UnimplementedError("reduce_scatter of bfloat16"));
  }
  absl::Status st = CheckPair(in, out, out.count * static_cast<size_t>(size_), out.count);
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

absl::Status SingleRankGroup::DoAllReduceSum(const Buffer&, std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoAllGather(const Buffer&, const Buffer&, std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoReduceScatterSum(const Buffer&, const Buffer&,
                                                 std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoBroadcast(const Buffer&, int, std::chrono::milliseconds) {
  return absl::OkStatus();
}
absl::Status SingleRankGroup::DoBarrier(std::chrono::milliseconds) { return absl::OkStatus(); }

}  // namespace latchkey::comm
