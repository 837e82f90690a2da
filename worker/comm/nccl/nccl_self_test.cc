#include "worker/comm/nccl/nccl_self_test.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_group.h"
#include "worker/comm/store.h"
#include "worker/device/cuda_runtime.h"

namespace latchkey::comm {
namespace {

constexpr std::chrono::milliseconds kTimeout{30000};
constexpr size_t kCount = size_t{1} << 22;  // elements per collective: 16 MiB of float32

// Device memory freed on scope exit.
struct DeviceBytes {
  explicit DeviceBytes(size_t n) { ok = cudaMalloc(&p, n) == cudaSuccess; }
  ~DeviceBytes() {
    if (p != nullptr) (void)cudaFree(p);
  }
  void* p = nullptr;
  bool ok = false;
};

struct Case {
  NcclGroup::Op op;
  const char* name;
  DataType type;
};

// Every op with every dtype it takes: sums in float32 and float64, bfloat16 moved unreduced
// (all-gather and broadcast only).
constexpr Case kCases[] = {
    {NcclGroup::Op::kAllReduce, "all_reduce", DataType::kFloat32},
    {NcclGroup::Op::kAllReduce, "all_reduce", DataType::kFloat64},
    {NcclGroup::Op::kAllGather, "all_gather", DataType::kFloat32},
    {NcclGroup::Op::kAllGather, "all_gather", DataType::kFloat64},
    {NcclGroup::Op::kAllGather, "all_gather", DataType::kBFloat16},
    {NcclGroup::Op::kReduceScatter, "reduce_scatter", DataType::kFloat32},
    {NcclGroup::Op::kReduceScatter, "reduce_scatter", DataType::kFloat64},
    {NcclGroup::Op::kBroadcast, "broadcast", DataType::kFloat32},
    {NcclGroup::Op::kBroadcast, "broadcast", DataType::kFloat64},
    {NcclGroup::Op::kBroadcast, "broadcast", DataType::kBFloat16},
    {NcclGroup::Op::kBarrier, "barrier", DataType::kFloat32},
};
constexpr size_t kNumCases = sizeof(kCases) / sizeof(kCases[0]);

// Rank r's element i: a small integer (so sums of a few ranks are exact in every float type)
// that differs between ranks; for bfloat16 raw 16-bit words.
double Value(size_t i, int r) {
  return static_cast<double>(static_cast<int>((i * 7 + 13 * r) % 1021) - 510);
}

void Put(std::string& bytes, size_t i, DataType t, double v) {
  if (t == DataType::kFloat32) {
    const float f = static_cast<float>(v);
    std::memcpy(&bytes[i * 4], &f, 4);
  } else {
    std::memcpy(&bytes[i * 8], &v, 8);
  }
}

// Rank r's input of `count` elements.
std::string Input(DataType t, size_t count, int r) {
  std::string s(count * DataTypeSize(t), '\0');
  if (t == DataType::kBFloat16) {
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 7 + 3 + 17 * r) % 61);
    return s;
  }
  for (size_t i = 0; i < count; ++i) Put(s, i, t, Value(i, r));
  return s;
}

// What rank `rank` of `n` must hold after the collective: in `in` for the in-place ops (all-reduce,
// broadcast from rank 0), in `out` for the others. `in_count` elements per rank's input.
std::string Expected(const Case& c, size_t in_count, int rank, int n) {
  const size_t size = DataTypeSize(c.type);
  switch (c.op) {
    case NcclGroup::Op::kAllReduce: {
      std::string s(in_count * size, '\0');
      for (size_t i = 0; i < in_count; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += Value(i, r);
        Put(s, i, c.type, sum);
      }
      return s;
    }
    case NcclGroup::Op::kAllGather: {
      std::string s;
      for (int r = 0; r < n; ++r) s += Input(c.type, in_count, r);
      return s;
    }
    case NcclGroup::Op::kReduceScatter: {
      const size_t chunk = in_count / n;
      std::string s(chunk * size, '\0');
      for (size_t i = 0; i < chunk; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += Value(rank * chunk + i, r);
        Put(s, i, c.type, sum);
      }
      return s;
    }
    case NcclGroup::Op::kBroadcast:
      return Input(c.type, in_count, 0);
    case NcclGroup::Op::kBarrier:
      break;
  }
  return "";
}

// One rank's run of every case on its communicator; `lines` gets one entry per case.
void RunCases(NcclGroup& group, int device, int rank, int n, std::vector<NcclSelfTestLine>* lines) {
  for (const Case& c : kCases) {
    NcclSelfTestLine line;
    line.op = c.name;
    line.dtype = DataTypeName(c.type);
    const size_t size = DataTypeSize(c.type);
    const bool barrier = c.op == NcclGroup::Op::kBarrier;
    // all_gather: each rank gives kCount / n; reduce_scatter: each gets kCount / n.
    const size_t in_count = c.op == NcclGroup::Op::kAllGather ? kCount / n : kCount;
    const size_t out_count = c.op == NcclGroup::Op::kAllGather       ? kCount
                             : c.op == NcclGroup::Op::kReduceScatter ? kCount / n
                                                                     : in_count;
    line.bytes = barrier ? 0 : kCount * size;
    const std::string input = barrier ? std::string() : Input(c.type, in_count, rank);
    // Rank 1..n-1 of a broadcast start from something else than the root's data.
    const std::string start =
        c.op == NcclGroup::Op::kBroadcast && rank != 0 ? std::string(input.size(), '\x5a') : input;
    DeviceBytes in(barrier ? 4 : input.size());
    DeviceBytes out(barrier ? 4 : out_count * size);
    // The output starts as a sentinel (all bits set: a NaN in every float type), so an output
    // left unwritten is told from a written one.
    const std::string sentinel(barrier ? 0 : out_count * size, '\xff');
    if (!in.ok || !out.ok ||
        (!barrier &&
         (cudaMemcpy(in.p, start.data(), start.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
          cudaMemset(out.p, 0xff, sentinel.size()) != cudaSuccess))) {
      line.detail = "device allocation or copy failed";
      lines->push_back(std::move(line));
      continue;
    }
    const Buffer bin{in.p, in_count, c.type, Device::Cuda(device)};
    const Buffer bout{out.p, out_count, c.type, Device::Cuda(device)};
    const bool in_place = c.op == NcclGroup::Op::kAllReduce || c.op == NcclGroup::Op::kBroadcast;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = group.IssueForTesting(c.op, bin, bout, kTimeout);
    line.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string got_in(start.size(), '\0'), got_out(sentinel.size(), '\0');
    if (!st.ok()) {
      line.detail = std::string(st.message());
    } else if (!barrier && (cudaMemcpy(got_in.data(), in.p, got_in.size(),
                                       cudaMemcpyDeviceToHost) != cudaSuccess ||
                            cudaMemcpy(got_out.data(), out.p, got_out.size(),
                                       cudaMemcpyDeviceToHost) != cudaSuccess)) {
      line.detail = "cudaMemcpy back failed";
    } else if (!barrier) {
      const std::string want = Expected(c, in_count, rank, n);
      if (in_place) {
        if (got_in != want)
          line.detail =
              "in-place result differs from the expected " +
              std::string(c.op == NcclGroup::Op::kBroadcast ? "root's data" : "rank-order sum");
        else if (got_out != sentinel)
          line.detail = "an unused buffer was written";
      } else {
        if (got_out == sentinel)
          line.detail = "output left unwritten (still the sentinel)";
        else if (got_out != want)
          line.detail = "output differs from the expected result";
        else if (got_in != start)
          line.detail = "the input was changed";
      }
    }
    line.ok = line.detail.empty();
    lines->push_back(std::move(line));
  }
}

// A communicator of `devices.size()` ranks, rank r on cuda:devices[r], ranks as threads (the
// unique id through one in-memory store), every case run on each.
absl::Status RunRanks(const std::vector<int>& devices, std::vector<NcclSelfTestLine>* lines) {
  const int n = static_cast<int>(devices.size());
  InMemoryStore store;
  std::vector<absl::Status> status(n);
  std::vector<std::vector<NcclSelfTestLine>> rank_lines(n);
  auto rank_main = [&](int r) -> absl::Status {
    if (absl::Status st = UseCudaDevice(devices[r]); !st.ok()) return st;
    absl::StatusOr<std::string> id = ExchangeNcclUniqueId(store, r, n, kTimeout);
    if (!id.ok()) return id.status();
    ncclUniqueId uid;
    std::memcpy(uid.internal, id->data(), sizeof(uid.internal));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t raw = nullptr;
    ncclResult_t res = ncclCommInitRankConfig(&raw, n, uid, r, &cfg);
    const auto until = std::chrono::steady_clock::now() + kTimeout;
    while (res == ncclInProgress && std::chrono::steady_clock::now() < until) {
      if (ncclCommGetAsyncError(raw, &res) != ncclSuccess) res = ncclInternalError;
    }
    if (res != ncclSuccess) {
      absl::Status st = NcclStatus(res, raw, "ncclCommInitRankConfig", __FILE__, __LINE__);
      if (raw != nullptr) (void)ncclCommAbort(raw);
      return st;
    }
    NcclGroup group("self", r, n, raw, devices[r], std::make_shared<CollectiveStats>());
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::InternalError("cudaStreamCreateWithFlags failed");
    }
    group.set_stream(stream);
    RunCases(group, devices[r], r, n, &rank_lines[r]);
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { status[r] = rank_main(r); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) {
      return n == 1 ? status[r]
                    : absl::Status(status[r].code(), "rank " + std::to_string(r) + ": " +
                                                         std::string(status[r].message()));
    }
  }
  // One line per case: rank 0's, failed when any rank's failed (naming the rank).
  absl::Status first;
  for (size_t i = 0; i < kNumCases; ++i) {
    NcclSelfTestLine line = rank_lines[0][i];
    for (int r = 0; r < n && line.ok; ++r) {
      if (!rank_lines[r][i].ok) {
        line.ok = false;
        line.detail = (n == 1 ? "" : "rank " + std::to_string(r) + ": ") + rank_lines[r][i].detail;
      }
    }
    if (!line.ok && first.ok()) {
      first = absl::InternalError(line.op + " " + line.dtype + ": " + line.detail);
    }
    lines->push_back(std::move(line));
  }
  return first;
}

}  // namespace

absl::Status RunNcclSelfTest(int device, std::vector<NcclSelfTestLine>* lines) {
  return RunRanks({device}, lines);
}

absl::Status RunNcclTwoRankSelfTest(int device0, int device1,
                                    std::vector<NcclSelfTestLine>* lines) {
  return RunRanks({device0, device1}, lines);
}

size_t NcclSelfTestCases() { return kNumCases; }

}  // namespace latchkey::comm
