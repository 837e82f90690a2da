#include "worker/comm/process_groups.h"

#include <algorithm>
#include <vector>

#include "worker/comm/gloo/gloo_backend.h"
#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/shm/shm_backend.h"

namespace latchkey::comm {
namespace {

// kAuto and kShm: every parallel group first tries a shared segment (world, TP, DP, in that
// order on every rank); under kAuto the groups whose ranks cannot all map theirs connect
// through gloo, under kShm they fail.
absl::Status ConnectShmGroups(CommBackend backend, const RendezvousConfig& config,
                              const std::shared_ptr<Store>& store, ProcessGroups* g) {
  struct Want {
    std::string key;
    std::string name;
    int rank;
    int size;
    std::shared_ptr<Group>* out;
    bool* gloo;
  };
  GlooGroupMask gloo{false, false, false};
  std::vector<Want> wants = {{"world", "world", g->rank, g->world_size, &g->world, &gloo.world}};
  if (g->tp > 1) {
    wants.push_back(
        {"tp" + std::to_string(g->dp_rank), "tp", g->tp_rank, g->tp, &g->tp_group, &gloo.tp});
  }
  if (g->dp > 1) {
    wants.push_back(
        {"dp" + std::to_string(g->tp_rank), "dp", g->dp_rank, g->dp, &g->dp_group, &gloo.dp});
  }
  int host_ranks = config.local_ranks;
  for (const Want& w : wants) {
    ShmGroupRequest req{w.key, w.name, w.rank, w.size, std::max(host_ranks, w.size)};
    std::string why_not;
    auto grp = TryShmGroup(config, *store, req, g->stats, &why_not);
    if (!grp.ok()) return grp.status();
    if (*grp != nullptr) {
      *w.out = *std::move(grp);
      if (w.name == "world") host_ranks = std::max(host_ranks, g->world_size);
      continue;
    }
    if (backend == CommBackend::kShm) {
      return absl::FailedPreconditionError("latchkey.backend: \"shm\" but the ranks of group '" +
                                           w.name + "' cannot share one memory segment (" +
                                           why_not + "); use \"auto\" or \"gloo\"");
    }
    *w.gloo = true;
  }
  if (!gloo.world && !gloo.tp && !gloo.dp) return absl::OkStatus();
  return ConnectGlooGroups(config, store, g, gloo);
}

// FAILED_PRECONDITION when the parallel groups of `backend` cannot take `device`'s buffers:
// nccl's live on cuda, the others' on the CPU. The spec refuses such pairs already
// (common/job_spec.cc); this keeps a direct caller from forming groups its buffers miss.
absl::Status CheckBackendDevice(CommBackend backend, const Device& device) {
  if ((backend == CommBackend::kNccl) != device.is_cpu()) return absl::OkStatus();
  return absl::FailedPreconditionError(std::string("latchkey.backend: \"") +
                                       CommBackendName(backend) + "\" cannot form groups for " +
                                       device.ToString() +
                                       " buffers (nccl takes cuda, gloo, shm and auto the cpu)");
}

}  // namespace

ProcessGroups MakeSingleProcessGroups(std::shared_ptr<CollectiveStats> stats, Device device) {
  ProcessGroups g;
  g.stats = stats ? std::move(stats) : std::make_shared<CollectiveStats>();
  g.world = std::make_shared<SingleRankGroup>("world", device, g.stats);
  g.tp_group = std::make_shared<SingleRankGroup>("tp", device, g.stats);
  g.dp_group = std::make_shared<SingleRankGroup>("dp", device, g.stats);
  return g;
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(CommBackend backend,
                                                  const RendezvousConfig& config) {
  const RankGrid grid{config.world_size, config.tp};
  if (!grid.valid()) {
    return absl::InvalidArgumentError(
        "latchkey.world_size: " + std::to_string(config.world_size) +
        " is not a positive multiple of tensor_parallel.autotp_size " + std::to_string(config.tp));
  }
  if (!grid.contains(config.rank)) {
    return absl::InvalidArgumentError(
        "RANK: " + std::to_string(config.rank) +
        " outside [0, WORLD_SIZE=" + std::to_string(config.world_size) + ")");
  }
  // Every dimension starts as a group of one on the rank's device; the backend replaces the
  // parallel ones.
  ProcessGroups g = MakeSingleProcessGroups(config.stats, config.device);
  g.recorder = config.recorder;
  for (Group* grp : {g.world.get(), g.tp_group.get(), g.dp_group.get()}) {
    grp->set_recorder(config.recorder);
  }
  g.rank = config.rank;
  g.world_size = config.world_size;
  g.tp = config.tp;
  g.dp = grid.dp();
  g.tp_rank = grid.tp_rank(config.rank);
  g.dp_rank = grid.dp_rank(config.rank);
  if (config.world_size == 1) return g;
  if (absl::Status st = CheckBackendDevice(backend, config.device); !st.ok()) return st;

  absl::Status st;
  std::shared_ptr<Store> store = config.store;
  if (store == nullptr) {
    auto tcp = ConnectTcpStore(config.host, config.port, config.rank == 0, config.world_size,
                               config.rendezvous_timeout);
    if (tcp.ok()) {
      store = *std::move(tcp);
    } else {
      st = tcp.status();
    }
  }
  g.store = store;
  if (st.ok()) {
    switch (backend) {
      case CommBackend::kGloo:
        st = ConnectGlooGroups(config, store, &g);
        break;
      case CommBackend::kAuto:
      case CommBackend::kShm:
        st = ConnectShmGroups(backend, config, store, &g);
        break;
      case CommBackend::kNccl:
        st = ConnectNcclGroups(config, store, &g);
        break;
    }
  }
  // The backend choice names its spec key itself.
  if (st.code() == absl::StatusCode::kFailedPrecondition) return st;
  if (!st.ok()) {
    return absl::Status(st.code(), std::string(CommBackendName(backend)) + " rendezvous at " +
                                       config.host + ":" + std::to_string(config.port) + " (rank " +
                                       std::to_string(config.rank) +
                                       "): " + std::string(st.message()));
  }
  for (Group* grp : {g.world.get(), g.tp_group.get(), g.dp_group.get()}) {
    grp->set_default_timeout(config.collective_timeout);
    grp->set_recorder(config.recorder);
  }
  return g;
}

}  // namespace latchkey::comm
