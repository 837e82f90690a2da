// The CPU limit of this process's control group (cgroup v2): a container's CPU limit, which
// Kubernetes sets from the pod's `limits.cpu` and Docker from `--cpus`. A rank sizes its thread
// pools from it (worker/train/threads.h): the CPU set alone is every CPU of the node unless the
// kubelet pins the pod's cores.
//
// Thread-safety: pure functions, and one that reads /proc and /sys.
#ifndef LATCHKEY_COMMON_CPU_QUOTA_H_
#define LATCHKEY_COMMON_CPU_QUOTA_H_

#include <optional>
#include <string>

namespace latchkey {

// A `cpu.max` file's text ("QUOTA PERIOD" in microseconds, "max PERIOD" when unlimited) as
// whole cores, rounded up (150000 100000: 2); none when unlimited or not of that form.
std::optional<int> CoresOfCpuMax(const std::string& text);

// The tightest quota of this process's cgroup and its ancestors under `cgroup_root`
// (/sys/fs/cgroup), the group read from `proc_self_cgroup` (/proc/self/cgroup, its "0::PATH"
// line); none when no group on the way has one, or on cgroup v1.
std::optional<int> CgroupCpuQuotaCores(const std::string& proc_self_cgroup = "/proc/self/cgroup",
                                       const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_CPU_QUOTA_H_
