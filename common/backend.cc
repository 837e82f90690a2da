#include "common/backend.h"

namespace latchkey {

const char* CommBackendName(CommBackend b) {
  switch (b) {
    case CommBackend::kAuto:
      return "auto";
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kShm:
      return "shm";
    case CommBackend::kNccl:
      return "nccl";
  }
  return "unknown";
}

const char* DeviceKindName(DeviceKind d) { return d == DeviceKind::kCuda ? "cuda" : "cpu"; }

// Parsing walks the values through the one name table above, so a name and its value can never
// disagree.
std::optional<CommBackend> ParseCommBackend(absl::string_view name) {
  for (CommBackend b :
       {CommBackend::kAuto, CommBackend::kGloo, CommBackend::kShm, CommBackend::kNccl}) {
    if (name == CommBackendName(b)) return b;
  }
  return std::nullopt;
}

std::optional<DeviceKind> ParseDeviceKind(absl::string_view name) {
  for (DeviceKind d : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    if (name == DeviceKindName(d)) return d;
  }
  return std::nullopt;
}

}  // namespace latchkey
