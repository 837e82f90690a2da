#include "worker/memory/memory.h"

#include <string>

namespace latchkey::memory {

// Defined in cuda_memory.cc: the caching allocator's statistics, or the refusal of a libtorch
// without CUDA.
absl::StatusOr<std::unique_ptr<MemoryMeter>> MakeCudaMemoryMeter(int device_index);

namespace {

thread_local MemoryAccount* bound_account = nullptr;

class CpuMeter final : public MemoryMeter {
 public:
  explicit CpuMeter(MemoryAccount* account) : account_(account) {}
  int64_t AllocatedBytes() override { return account_->live_bytes(); }
  void ResetPeak() override { account_->ResetPeak(); }
  MemoryReading Read() override {
    return MemoryReading{account_->live_bytes(), account_->peak_bytes(), 0};
  }
  MemoryAccount* account() override { return account_; }

 private:
  MemoryAccount* account_;
};

}  // namespace

void MemoryAccount::Charge(int64_t bytes) {
  allocations_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  // The high-water mark only rises: retry while another thread raised it less far.
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryAccount::Credit(int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

void MemoryAccount::ResetPeak() { peak_.store(live_bytes(), std::memory_order_relaxed); }

MemoryAccount& ProcessAccount() {
  static MemoryAccount* const account = new MemoryAccount();  // never destroyed: see the header
  return *account;
}

MemoryAccount* NewAccount() { return new MemoryAccount(); }

MemoryAccount& CurrentAccount() {
  return bound_account != nullptr ? *bound_account : ProcessAccount();
}

ScopedAccount::ScopedAccount(MemoryAccount* account) : previous_(bound_account) {
  bound_account = account;
}

ScopedAccount::~ScopedAccount() { bound_account = previous_; }

absl::StatusOr<std::unique_ptr<MemoryMeter>> MakeMemoryMeter(bool cuda, int device_index) {
  if (cuda) return MakeCudaMemoryMeter(device_index);
  if (absl::Status st = InstallCountingCpuAllocator(); !st.ok()) return st;
  return std::unique_ptr<MemoryMeter>(std::make_unique<CpuMeter>(NewAccount()));
}

}  // namespace latchkey::memory
