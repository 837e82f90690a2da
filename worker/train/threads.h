// CPU settings of one rank process. Several ranks share the machine's cores, so each rank gets
// cores / local ranks threads for both libtorch's intra-op pool and OpenBLAS, where "cores" are
// the CPUs this process may run on (its affinity mask: a container's or taskset's CPU set),
// bounded by its cgroup's CPU quota (a container's CPU limit: common/cpu_quota.h), not every CPU
// of the machine. The allocator keeps the memory a micro-batch freed for the next one
// instead of returning it to the kernel and faulting it in again.
#ifndef LATCHKEY_WORKER_TRAIN_THREADS_H_
#define LATCHKEY_WORKER_TRAIN_THREADS_H_

namespace latchkey {

// The CPUs this process may run on, at most its cgroup's CPU quota (at least 1).
int UsableCores();

// Applies the thread budget and the allocator settings; returns the thread count applied (at
// least 1). Call once, before the training thread starts its work.
int ConfigureComputeThreads(int local_ranks);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_THREADS_H_
