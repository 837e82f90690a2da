// Gloo implementation of comm::Group (CPU, TCP transport), built on libgloo directly: the same
// libgloo.so.0 libtorch links, called in the caller's thread (about 3x lower latency here than
// c10d's ProcessGroupGloo, which also lacks reduce_scatter in libtorch 1.13).
// Host memory only: a buffer on any other device is refused (INVALID_ARGUMENT) before anything
// is issued. Created by the gloo backend (gloo_backend.cc) through comm::CreateProcessGroups.
// Thread-safety: as comm::Group (one thread at a time).
#ifndef LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUP_H_
#define LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUP_H_

#include <memory>
#include <string>

#include "worker/comm/comm.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace latchkey::comm {

// REQUIRES: `ctx` is fully connected (connectFullMesh done).
std::shared_ptr<Group> MakeGlooGroup(std::string name, std::shared_ptr<gloo::Context> ctx,
                                     std::shared_ptr<CollectiveStats> stats);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUP_H_
