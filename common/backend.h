// The collective backend and the device kind: one enum each and one name table each, shared by
// the job spec (latchkey.backend, latchkey.device: common/job_spec.h) and the worker's
// collectives (worker/comm/: CreateProcessGroups takes a CommBackend, a comm::Device has a
// DeviceKind). Torch-free and dependency-free.
// Thread-safety: plain values and pure functions.
#ifndef LATCHKEY_COMMON_BACKEND_H_
#define LATCHKEY_COMMON_BACKEND_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace latchkey {

// `latchkey.backend`: the collective backend of every process group (docs/job-spec.md,
// docs/transport.md). kGloo: CPU over TCP (libgloo). kShm: CPU through a shared-memory segment,
// for a group whose ranks can all map one. kNccl: the GPU backend. kAuto: per group, shm where
// every rank of the group maps the segment, else gloo (the runner turns it into nccl on cuda).
// A further backend adds a value here, a folder under worker/comm/ and a branch in
// comm::CreateProcessGroups.
enum class CommBackend { kAuto, kGloo, kShm, kNccl };

// `latchkey.device`: where the training core runs and its buffers live (cuda = cuda:LOCAL_RANK).
enum class DeviceKind { kCpu, kCuda };

const char* CommBackendName(CommBackend b);  // "auto", "gloo", "shm", "nccl"
const char* DeviceKindName(DeviceKind d);    // "cpu", "cuda"
// The value named exactly so; nullopt for any other name.
std::optional<CommBackend> ParseCommBackend(absl::string_view name);
std::optional<DeviceKind> ParseDeviceKind(absl::string_view name);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_BACKEND_H_
