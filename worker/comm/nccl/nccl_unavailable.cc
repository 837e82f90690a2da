// ConnectNcclGroups of a build without LATCHKEY_CUDA: the nccl backend is refused by name.
#include "worker/comm/nccl/nccl_backend.h"

namespace latchkey::comm {

absl::Status ConnectNcclGroups(const RendezvousConfig&, std::shared_ptr<Store>, ProcessGroups*) {
  return absl::UnimplementedError(
      "latchkey.backend: nccl is not in this latchkey-worker (cmake -DLATCHKEY_CUDA=ON builds it)");
}

absl::StatusOr<std::string> ExchangeNcclUniqueId(Store&, int, int, std::chrono::milliseconds) {
  return absl::UnimplementedError(
      "nccl unique id: not in this build (cmake -DLATCHKEY_CUDA=ON builds it)");
}

}  // namespace latchkey::comm
