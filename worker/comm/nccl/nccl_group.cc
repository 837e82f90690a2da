#include "worker/comm/nccl/nccl_group.h"

#include <cstdint>
#include <thread>

namespace latchkey::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;

// How long the destructor lets a healthy communicator finalize before aborting it.
constexpr std::chrono::seconds kFinalizeTimeout{5};

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kUInt8:
      return ncclUint8;
  }
  return ncclFloat32;
}

// Between polls: yield for the first ones (collectives of a TP layer take microseconds), then
// sleep briefly so a long wait does not burn a core.
void Backoff(int polls) {
  if (polls < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::Status CudaStatus(cudaError_t e, const char* call, const char* file, int line) {
  return absl::InternalError(std::string(call) + " at " + file + ":" + std::to_string(line) +
                             ": CUDA error: " + cudaGetErrorString(e) + " (" + NcclVersionString() +
                             ")");
}

bool Overlap(const Buffer& a, const Buffer& b) {
  const auto* pa = static_cast<const char*>(a.data);
  const auto* pb = static_cast<const char*>(b.data);
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

}  // namespace

std::string NcclVersionString() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9; X*1000 + Y*100 + Z before.
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  const int patch = v % 100;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(patch);
}

absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, const char* call, const char* file,
                        int line) {
  std::string msg =
      std::string(call) + " at " + file + ":" + std::to_string(line) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != 0) msg += std::string(" (") + last + ")";
  msg += " [" + NcclVersionString() + "]";
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

NcclGroup::NcclGroup(std::string name, int rank, int size, ncclComm_t comm, int device,
                     std::shared_ptr<CollectiveStats> stats)
    : Group(std::move(name), rank, size, Device::Cuda(device), std::move(stats)),
      comm_(comm),
      device_(device) {}

NcclGroup::~NcclGroup() {
  (void)cudaSetDevice(device_);
  if (!aborted_) {
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto until = SteadyClock::now() + kFinalizeTimeout;
    for (int polls = 0; r == ncclInProgress && SteadyClock::now() < until; ++polls) {
      Backoff(polls);
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
    }
    if (r == ncclSuccess) {
      (void)ncclCommDestroy(comm_);
    } else {
      Abort();
    }
  }
  if (done_ != nullptr) (void)cudaEventDestroy(done_);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
}

void NcclGroup::Abort() {
  if (aborted_) return;
  aborted_ = true;
  (void)ncclCommAbort(comm_);
}

absl::Status NcclGroup::WaitStream(const char* call, const char* file, int line,
                                   SteadyClock::time_point deadline,
                                   std::chrono::milliseconds timeout) {
  if (done_ == nullptr) {
    if (cudaError_t e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaStatus(e, "cudaEventCreateWithFlags", file, line);
    }
  }
  if (cudaError_t e = cudaEventRecord(done_, stream_); e != cudaSuccess) {
    return CudaStatus(e, "cudaEventRecord", file, line);
  }
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      Abort();
      return CudaStatus(q, call, file, line);
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      absl::Status st = NcclStatus(async, comm_, call, file, line);
      Abort();
      return st;
    }
    if (SteadyClock::now() >= deadline) {
      Abort();
      return absl::DeadlineExceededError(std::string(call) + " at " + file + ":" +
                                         std::to_string(line) + ": not done after " +
                                         std::to_string(timeout.count()) +
                                         " ms; communicator aborted [" + NcclVersionString() + "]");
    }
    Backoff(polls);
  }
}

template <typename Fn>
absl::Status NcclGroup::Issue(const char* call, const char* file, int line,
                              std::chrono::milliseconds timeout, Fn&& enqueue) {
  if (aborted_) {
    return absl::FailedPreconditionError(std::string(call) +
                                         ": the communicator was aborted by an earlier failure");
  }
  const auto deadline = SteadyClock::now() + timeout;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice", file, line);
  }
  ncclResult_t r = enqueue();
  // Nonblocking: the enqueue itself may still be in progress.
  for (int polls = 0; r == ncclInProgress; ++polls) {
    if (SteadyClock::now() >= deadline) break;
    Backoff(polls);
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r == ncclInProgress) {
    Abort();
    return absl::DeadlineExceededError(std::string(call) + " at " + file + ":" +
                                       std::to_string(line) + ": not enqueued after " +
                                       std::to_string(timeout.count()) +
                                       " ms; communicator aborted [" + NcclVersionString() + "]");
  }
  if (r != ncclSuccess) {
    absl::Status st = NcclStatus(r, comm_, call, file, line);
    Abort();
    return st;
  }
  return WaitStream(call, file, line, deadline, timeout);
}

#define LK_NCCL_ISSUE(timeout, expr) Issue(#expr, __FILE__, __LINE__, timeout, [&] { return expr; })

absl::Status NcclGroup::CopyLocal(const Buffer& src, const Buffer& dst) {
  if (Overlap(src, dst)) {
    return absl::InvalidArgumentError("overlapping device buffers for a local copy");
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return CudaStatus(e, "cudaSetDevice", __FILE__, __LINE__);
  }
  if (cudaError_t e =
          cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_);
      e != cudaSuccess) {
    return CudaStatus(e, "cudaMemcpyAsync", __FILE__, __LINE__);
  }
  const std::chrono::milliseconds timeout = default_timeout();
  return WaitStream("cudaMemcpyAsync", __FILE__, __LINE__, SteadyClock::now() + timeout, timeout);
}

absl::Status NcclGroup::DoAllReduceSum(const Buffer& d, std::chrono::milliseconds timeout) {
  return LK_NCCL_ISSUE(
      timeout, ncclAllReduce(d.data, d.data, d.count, NcclType(d.type), ncclSum, comm_, stream_));
}

absl::Status NcclGroup::DoAllGather(const Buffer& in, const Buffer& out,
                                    std::chrono::milliseconds timeout) {
  // In place when `in` is this rank's chunk of `out` (NCCL's own in-place form).
  return LK_NCCL_ISSUE(
      timeout, ncclAllGather(in.data, out.data, in.count, NcclType(in.type), comm_, stream_));
}

absl::Status NcclGroup::DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                           std::chrono::milliseconds timeout) {
  // In place when `out` is this rank's chunk of `in` (NCCL's own in-place form).
  return LK_NCCL_ISSUE(timeout, ncclReduceScatter(in.data, out.data, out.count, NcclType(in.type),
                                                  ncclSum, comm_, stream_));
}

absl::Status NcclGroup::DoBroadcast(const Buffer& d, int root, std::chrono::milliseconds timeout) {
  return LK_NCCL_ISSUE(
      timeout, ncclBroadcast(d.data, d.data, d.count, NcclType(d.type), root, comm_, stream_));
}

absl::Status NcclGroup::DoBarrier(std::chrono::milliseconds timeout) {
  if (scratch_ == nullptr) {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaStatus(e, "cudaSetDevice", __FILE__, __LINE__);
    }
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, sizeof(float)); e != cudaSuccess) {
      return CudaStatus(e, "cudaMalloc", __FILE__, __LINE__);
    }
    scratch_ = static_cast<float*>(p);
  }
  return LK_NCCL_ISSUE(timeout,
                       ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
}

#undef LK_NCCL_ISSUE

absl::Status NcclGroup::IssueForTesting(Op op, const Buffer& in, const Buffer& out,
                                        std::chrono::milliseconds timeout) {
  if (op != Op::kBarrier) {
    if (absl::Status st = CheckDevice(in.device); !st.ok()) return st;
    if (absl::Status st = CheckDevice(out.device); !st.ok()) return st;
  }
  switch (op) {
    case Op::kAllReduce:
      return DoAllReduceSum(in, timeout);
    case Op::kAllGather:
      return DoAllGather(in, out, timeout);
    case Op::kReduceScatter:
      return DoReduceScatterSum(in, out, timeout);
    case Op::kBroadcast:
      return DoBroadcast(in, 0, timeout);
    case Op::kBarrier:
      return DoBarrier(timeout);
  }
  return absl::InvalidArgumentError("unknown op");
}

}  // namespace latchkey::comm
