// What a rank's tensors hold, in bytes: the one place the worker counts memory
// (docs/memory.md, "Measuring memory").
//
// CPU: a counting allocator installed for libtorch's CPU allocations (c10::SetCPUAllocator, at a
// priority above libtorch's default, wrapping the allocator it replaces). Every allocation of
// n > 0 bytes is charged to the MemoryAccount bound to the allocating thread (the process
// account when none is bound) and credited back to that same account when freed, on whatever
// thread the free happens. Counted: the bytes requested (tensor storage), not the allocator's
// own 64-byte header nor malloc's overhead. Tensors made before the install are not counted
// (their frees are not either). CUDA: the caching allocator's statistics of the device
// (allocated bytes of live blocks, their high-water mark, and the reserved segments beside).
//
// The engine (worker/train/engine.cc) owns one account per engine and binds it to its thread
// while it builds and runs windows, so ranks run as threads of one process, or several engines
// of one process (bench/memory.cc), each see their own bytes. Allocations inside libtorch's
// intra-op worker threads are charged to the process account.
//
// Torch-free: the allocator and the CUDA statistics live in the .cc files.
// Thread-safety: every function and MemoryAccount method is thread-safe (atomics); a
// MemoryMeter is used by one thread at a time. Accounts live until the process exits (a freed
// tensor may credit its account at any later time).
#ifndef LATCHKEY_WORKER_MEMORY_MEMORY_H_
#define LATCHKEY_WORKER_MEMORY_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey::memory {

// Bytes live in one account and their high-water mark since the last ResetPeak.
class MemoryAccount {
 public:
  MemoryAccount() = default;
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  void Charge(int64_t bytes);  // an allocation of `bytes`
  void Credit(int64_t bytes);  // the free of an allocation of `bytes`
  int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  // The high-water mark starts again from the bytes live now.
  void ResetPeak();

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};  // every Charge since creation
};

// The account of allocations on threads with none bound.
MemoryAccount& ProcessAccount();
// A new account, alive until the process exits.
MemoryAccount* NewAccount();
// The account this thread's allocations are charged to now.
MemoryAccount& CurrentAccount();

// Binds `account` to this thread for the scope's lifetime (nests; restores the previous one).
class ScopedAccount {
 public:
  explicit ScopedAccount(MemoryAccount* account);
  ~ScopedAccount();
  ScopedAccount(const ScopedAccount&) = delete;
  ScopedAccount& operator=(const ScopedAccount&) = delete;

 private:
  MemoryAccount* previous_;
};

// Installs the counting CPU allocator, once per process (later calls return the first call's
// result). Call it before any tensor is made (the worker's main does). FAILED_PRECONDITION when
// the allocator in place cannot be wrapped (it has no raw deleter).
absl::Status InstallCountingCpuAllocator();
bool CountingCpuAllocatorInstalled();

// One reading of a device's memory, in bytes.
struct MemoryReading {
  int64_t allocated_bytes = 0;  // live now
  int64_t peak_bytes = 0;       // high-water mark of allocated since the last ResetPeak
  int64_t reserved_bytes = 0;   // CUDA: the caching allocator's segments; CPU: 0
};

// The memory of one engine's device: its CPU account, or the CUDA caching allocator's
// statistics of its device.
class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  virtual int64_t AllocatedBytes() = 0;
  virtual void ResetPeak() = 0;
  virtual MemoryReading Read() = 0;
  // The CPU account to bind to the engine's thread (ScopedAccount); null on CUDA.
  virtual MemoryAccount* account() = 0;
};

// CPU (`cuda` false): installs the counting allocator if it is not, and meters a new account.
// CUDA: the caching allocator of cuda:`device_index`; UNIMPLEMENTED in a build whose libtorch
// has no CUDA (LATCHKEY_TORCH_CUDA off).
absl::StatusOr<std::unique_ptr<MemoryMeter>> MakeMemoryMeter(bool cuda, int device_index);

}  // namespace latchkey::memory

#endif  // LATCHKEY_WORKER_MEMORY_MEMORY_H_
