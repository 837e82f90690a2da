#include "worker/comm/nccl/nccl_self_test.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_group.h"
#include "worker/comm/store.h"
#include "worker/device/cuda_runtime.h"

namespace latchkey::comm {
namespace {

constexpr std::chrono::milliseconds kTimeout{30000};

// Device memory freed on scope exit.
struct DeviceBytes {
  explicit DeviceBytes(size_t n) { ok = cudaMalloc(&p, n) == cudaSuccess; }
  ~DeviceBytes() {
    if (p != nullptr) (void)cudaFree(p);
  }
  void* p = nullptr;
  bool ok = false;
};

// Raw 16-bit words (bfloat16 moves unreduced: all-gather and broadcast only).
std::string Pattern(size_t bytes, int salt) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>((i * 7 + salt) % 61);
  return s;
}

}  // namespace

absl::Status RunNcclSelfTest(int device, std::vector<NcclSelfTestLine>* lines) {
  if (absl::Status st = UseCudaDevice(device); !st.ok()) return st;
  InMemoryStore store;
  absl::StatusOr<std::string> id = ExchangeNcclUniqueId(store, 0, 1, kTimeout);
  if (!id.ok()) return id.status();
  ncclUniqueId uid;
  std::memcpy(uid.internal, id->data(), sizeof(uid.internal));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t raw = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&raw, 1, uid, 0, &cfg);
  const auto until = std::chrono::steady_clock::now() + kTimeout;
  while (r == ncclInProgress && std::chrono::steady_clock::now() < until) {
    if (ncclCommGetAsyncError(raw, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r != ncclSuccess) {
    absl::Status st = NcclStatus(r, raw, "ncclCommInitRankConfig", __FILE__, __LINE__);
    if (raw != nullptr) (void)ncclCommAbort(raw);
    return st;
  }
  NcclGroup group("self", 0, 1, raw, device, std::make_shared<CollectiveStats>());
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return absl::InternalError("cudaStreamCreateWithFlags failed");
  }
  group.set_stream(stream);

  absl::Status first;
  struct Case {
    NcclGroup::Op op;
    const char* name;
    DataType type;
  };
  const Case cases[] = {
      {NcclGroup::Op::kAllReduce, "all_reduce", DataType::kFloat32},
      {NcclGroup::Op::kAllReduce, "all_reduce", DataType::kFloat64},
      {NcclGroup::Op::kAllGather, "all_gather", DataType::kFloat32},
      {NcclGroup::Op::kAllGather, "all_gather", DataType::kBFloat16},
      {NcclGroup::Op::kReduceScatter, "reduce_scatter", DataType::kFloat32},
      {NcclGroup::Op::kBroadcast, "broadcast", DataType::kFloat32},
      {NcclGroup::Op::kBroadcast, "broadcast", DataType::kBFloat16},
      {NcclGroup::Op::kBarrier, "barrier", DataType::kFloat32},
  };
  const size_t count = size_t{1} << 22;  // 16 MiB of float32
  for (const Case& c : cases) {
    NcclSelfTestLine line;
    line.op = c.name;
    line.dtype = DataTypeName(c.type);
    const size_t bytes = c.op == NcclGroup::Op::kBarrier ? 0 : count * DataTypeSize(c.type);
    line.bytes = bytes;
    DeviceBytes in(bytes == 0 ? 4 : bytes);
    DeviceBytes out(bytes == 0 ? 4 : bytes);
    std::string want(bytes, '\0');
    // Floats built from small integers, so a one-rank sum leaves them bit-exact.
    if (c.type == DataType::kFloat32) {
      for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>(static_cast<int>(i % 1021) - 510);
        std::memcpy(&want[i * 4], &v, 4);
      }
    } else if (c.type == DataType::kFloat64) {
      for (size_t i = 0; i < count; ++i) {
        const double v = static_cast<double>(static_cast<int>(i % 1021) - 510);
        std::memcpy(&want[i * 8], &v, 8);
      }
    } else {
      want = Pattern(bytes, 3);
    }
    if (!in.ok || !out.ok ||
        (bytes > 0 &&
         cudaMemcpy(in.p, want.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) ||
        (bytes > 0 && cudaMemset(out.p, 0xff, bytes) != cudaSuccess)) {
      line.detail = "device allocation or copy failed";
    } else {
      const Buffer bin{in.p, count, c.type, Device::Cuda(device)};
      const Buffer bout{out.p, count, c.type, Device::Cuda(device)};
      // all_reduce and broadcast are in place on `in`; the others write `out`.
      const bool in_place = c.op == NcclGroup::Op::kAllReduce || c.op == NcclGroup::Op::kBroadcast;
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = group.IssueForTesting(c.op, bin, bout, kTimeout);
      line.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!st.ok()) {
        line.detail = std::string(st.message());
      } else if (bytes > 0) {
        std::string got(bytes, '\0');
        if (cudaMemcpy(got.data(), in_place ? in.p : out.p, bytes, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
          line.detail = "cudaMemcpy back failed";
        } else if (got != want) {
          line.detail = "result differs from the input (one rank: it must be unchanged)";
        } else {
          line.ok = true;
        }
      } else {
        line.ok = true;
      }
    }
    if (!line.ok && first.ok()) {
      first = absl::InternalError(line.op + " " + line.dtype + ": " + line.detail);
    }
    lines->push_back(std::move(line));
  }
  (void)cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);
  return first;
}

}  // namespace latchkey::comm
