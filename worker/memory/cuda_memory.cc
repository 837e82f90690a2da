// The CUDA half of memory.h: the caching allocator's statistics of one device, read through
// libtorch's CUDA API (c10_cuda), so only in a build whose libtorch has CUDA
// (LATCHKEY_TORCH_CUDA); elsewhere the refusal. The statistics are the allocator's host-side
// bookkeeping, updated when a block is handed out or returned: reading them needs no device
// synchronisation. Index 0 of each stat array is the aggregate over the small and large pools
// (StatType::AGGREGATE, in 1.13 and 2.x alike).
#include <string>

#include "worker/memory/memory.h"

#if LATCHKEY_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace latchkey::memory {

#if LATCHKEY_TORCH_CUDA

namespace {

class CudaMeter final : public MemoryMeter {
 private:
  // Defined before its uses: its return type is deduced (DeviceStats moved namespace in 2.x).
  auto Stats() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
  }

 public:
  explicit CudaMeter(int device) : device_(device) {}
  int64_t AllocatedBytes() override { return Stats().allocated_bytes[0].current; }
  void ResetPeak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
  }
  MemoryReading Read() override {
    const auto stats = Stats();
    return MemoryReading{stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak,
                         stats.reserved_bytes[0].current};
  }
  MemoryAccount* account() override { return nullptr; }

 private:
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryMeter>> MakeCudaMemoryMeter(int device_index) {
  return std::unique_ptr<MemoryMeter>(std::make_unique<CudaMeter>(device_index));
}

#else

absl::StatusOr<std::unique_ptr<MemoryMeter>> MakeCudaMemoryMeter(int device_index) {
  return absl::UnimplementedError(
      "memory accounting for cuda:" + std::to_string(device_index) +
      ": this build's libtorch has no CUDA (the caching allocator's statistics need c10_cuda)");
}

#endif

}  // namespace latchkey::memory
