// CPU thread budget for one rank: several ranks share the machine's cores, so each rank gets
// cores / local ranks threads for both libtorch's intra-op pool and OpenBLAS.
#ifndef LATCHKEY_WORKER_TRAIN_THREADS_H_
#define LATCHKEY_WORKER_TRAIN_THREADS_H_

namespace latchkey {

// Returns the thread count applied (at least 1).
int ConfigureComputeThreads(int local_ranks);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_THREADS_H_
