// latchkey-nccl-check: what this machine offers the NCCL backend, and (with --self-test) the
// backend exercised for real on a one-rank communicator and, with two GPUs, a two-rank one. Prints
// `key: value` lines, then with
// --self-test one line per collective. Exit 0: all asked for worked; 2: no CUDA device; 1: a
// failure.
//   latchkey-nccl-check [--self-test] [--device N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/nccl/nccl_group.h"
#include "worker/comm/nccl/nccl_self_test.h"
#include "worker/comm/store.h"
#include "worker/device/cuda_runtime.h"

int main(int argc, char** argv) {
  using namespace latchkey::comm;
  bool self_test = false;
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--self-test") == 0) {
      self_test = true;
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: latchkey-nccl-check [--self-test] [--device N]\n");
      return 1;
    }
  }
  std::printf("nccl: %s\n", NcclVersionString().c_str());
  std::printf("cuda: %s\n", latchkey::CudaVersionString().c_str());
  InMemoryStore store;
  auto id = ExchangeNcclUniqueId(store, 0, 1, std::chrono::milliseconds(10000));
  std::printf("unique_id: %s\n", id.ok() ? (std::to_string(id->size()) + " bytes").c_str()
                                         : std::string(id.status().message()).c_str());
  auto count = latchkey::CudaDeviceCount();
  if (!count.ok()) {
    std::printf("devices: none (%s)\n", std::string(count.status().message()).c_str());
    return 2;
  }
  std::printf("devices: %d\n", *count);
  if (!self_test) return id.ok() ? 0 : 1;
  const auto print = [](const char* ranks, const std::vector<NcclSelfTestLine>& lines) {
    for (const NcclSelfTestLine& l : lines) {
      const double gbps = l.seconds > 0 ? static_cast<double>(l.bytes) / l.seconds / 1e9 : 0.0;
      std::printf("self_test: %s %-14s %-8s %9zu bytes %9.3f ms %7.1f GB/s %s%s%s\n", ranks,
                  l.op.c_str(), l.dtype.c_str(), l.bytes, l.seconds * 1e3, gbps,
                  l.ok ? "ok" : "FAILED", l.detail.empty() ? "" : ": ", l.detail.c_str());
    }
  };
  std::vector<NcclSelfTestLine> lines;
  absl::Status st = RunNcclSelfTest(device, &lines);
  print("1 rank ", lines);
  // Two GPUs: the same on two ranks, where the sums differ from the inputs.
  if (*count >= 2) {
    std::vector<NcclSelfTestLine> two;
    const int other = device == 0 ? 1 : 0;
    absl::Status st2 = RunNcclTwoRankSelfTest(device, other, &two);
    print("2 ranks", two);
    if (st.ok() && !st2.ok())
      st = absl::Status(st2.code(), "2 ranks: " + std::string(st2.message()));
  } else {
    std::printf("self_test: 2 ranks skipped: one CUDA device\n");
  }
  std::printf("self_test: %s\n", st.ok() ? "ok" : std::string(st.message()).c_str());
  return st.ok() ? 0 : 1;
}
