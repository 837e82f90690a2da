// ConnectGlooGroups of a build without libgloo (the core-only CUDA build on a machine that has
// none): the gloo backend is refused by name; the nccl backend needs no gloo.
#include "worker/comm/gloo/gloo_backend.h"

namespace latchkey::comm {

bool GlooBuiltIn() { return false; }

absl::Status ConnectGlooGroups(const RendezvousConfig&, std::shared_ptr<Store>, ProcessGroups*,
                               GlooGroupMask) {
  return absl::UnimplementedError(
      "latchkey.backend: gloo is not in this latchkey-worker (built without libgloo); use "
      "\"nccl\" with latchkey.device \"cuda\"");
}

}  // namespace latchkey::comm
