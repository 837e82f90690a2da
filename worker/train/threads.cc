#include "worker/train/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "common/cpu_quota.h"

namespace latchkey {

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) cores = CPU_COUNT(&set);
  // A container's CPU limit: without pinned cores its CPU set is the whole node.
  if (const std::optional<int> quota = CgroupCpuQuotaCores()) cores = std::min(cores, *quota);
  return std::max(1, cores);
}

int ConfigureComputeThreads(int local_ranks) {
  const int threads = std::max(1, UsableCores() / std::max(1, local_ranks));
  at::set_num_threads(threads);
  // OpenBLAS starts one thread per core by default; there is no header for it in Debian's
  // runtime package, so find the symbol in the loaded BLAS if it is OpenBLAS.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
  // Every micro-batch allocates and frees the same activations (libtorch's CPU allocator is
  // malloc). glibc's defaults return a freed block above 128 KiB to the kernel (munmap, or a
  // trim of the heap's top), so the next micro-batch page-faults the same memory in again,
  // zeroed. Serve blocks up to 32 MiB (glibc's maximum) from the heap and never trim it: the
  // heap stays at the step's peak, which the next step needs anyway.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 16 << 20);
  return threads;
}

}  // namespace latchkey
