#include "worker/train/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <thread>

namespace latchkey {

int ConfigureComputeThreads(int local_ranks) {
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / std::max(1, local_ranks));
  at::set_num_threads(threads);
  // OpenBLAS starts one thread per core by default; there is no header for it in Debian's
  // runtime package, so find the symbol in the loaded BLAS if it is OpenBLAS.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
  return threads;
}

}  // namespace latchkey
