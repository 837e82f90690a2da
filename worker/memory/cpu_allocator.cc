// The counting CPU allocator (memory.h). Each allocation of n > 0 bytes asks the wrapped
// allocator for n + kHeader bytes and hands out the address kHeader past the start; the header
// holds n and the account charged, so the deleter (a plain function, as c10 requires) credits
// the right account with the right size on any thread. Keeping the data pointer equal to the
// DataPtr's context keeps raw_allocate/raw_deallocate working for libtorch code that uses them.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "worker/memory/memory.h"

namespace latchkey::memory {
namespace {

// libtorch aligns CPU storage to 64 bytes (c10::gAlignment); a 64-byte header keeps it.
constexpr size_t kHeader = 64;

// The wrapped allocator's deleter, set once before the counting allocator is installed.
c10::DeleterFnPtr inner_raw_deleter = nullptr;

struct Header {
  int64_t bytes;
  MemoryAccount* account;
};
static_assert(sizeof(Header) <= kHeader, "the header fits in front of the data");

// From 2.3 on, c10::Allocator::allocate is non-const and copy_data is pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define LATCHKEY_ALLOCATE_CONST
#define LATCHKEY_ALLOCATOR_COPY_DATA 1
#else
#define LATCHKEY_ALLOCATE_CONST const
#define LATCHKEY_ALLOCATOR_COPY_DATA 0
#endif

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) LATCHKEY_ALLOCATE_CONST override {
    // Zero bytes: the wrapped allocator's own (null) pointer, not counted.
    if (n == 0) return inner_->allocate(0);
    c10::DataPtr base = inner_->allocate(n + kHeader);
    void* start = base.release_context();  // ours now: the deleter frees it through inner_
    MemoryAccount& account = CurrentAccount();
    Header h{static_cast<int64_t>(n), &account};
    std::memcpy(start, &h, sizeof(h));
    account.Charge(h.bytes);
    void* data = static_cast<char*>(start) + kHeader;
    return c10::DataPtr(data, data, &Delete, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

#if LATCHKEY_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static void Delete(void* data) {
    if (data == nullptr) return;
    void* start = static_cast<char*>(data) - kHeader;
    Header h;
    std::memcpy(&h, start, sizeof(h));
    h.account->Credit(h.bytes);
    inner_raw_deleter(start);
  }

  c10::Allocator* inner_;
};

absl::Status install_status = absl::OkStatus();
std::atomic<bool> installed{false};

absl::Status InstallOnce() {
  c10::Allocator* inner = c10::GetCPUAllocator();
  if (inner == nullptr || inner->raw_deleter() == nullptr) {
    return absl::FailedPreconditionError(
        "memory accounting: the CPU allocator in place has no raw deleter, so it cannot be "
        "wrapped by the counting allocator");
  }
  auto* counting = new CountingCpuAllocator(inner);  // c10 takes it; lives for the process
  inner_raw_deleter = inner->raw_deleter();
  // Above libtorch's default registration (priority 0), so nothing registered by default
  // replaces it later.
  c10::SetCPUAllocator(counting, /*priority=*/1);
  if (c10::GetCPUAllocator() != counting) {
    return absl::FailedPreconditionError(
        "memory accounting: another CPU allocator of a higher priority is installed");
  }
  installed.store(true);
  return absl::OkStatus();
}

}  // namespace

absl::Status InstallCountingCpuAllocator() {
  static std::once_flag once;
  std::call_once(once, [] { install_status = InstallOnce(); });
  return install_status;
}

bool CountingCpuAllocatorInstalled() { return installed.load(); }

}  // namespace latchkey::memory
