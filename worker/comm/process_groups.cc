#include "worker/comm/process_groups.h"

#include "worker/comm/gloo/gloo_backend.h"

namespace latchkey::comm {

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
  }
  return "unknown";
}

std::optional<Backend> ParseBackend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  return std::nullopt;
}

ProcessGroups MakeSingleProcessGroups(std::shared_ptr<CollectiveStats> stats) {
  ProcessGroups g;
  g.stats = stats ? std::move(stats) : std::make_shared<CollectiveStats>();
  g.world = std::make_shared<SingleRankGroup>("world", g.stats);
  g.tp_group = std::make_shared<SingleRankGroup>("tp", g.stats);
  g.dp_group = std::make_shared<SingleRankGroup>("dp", g.stats);
  return g;
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(Backend backend, const RendezvousConfig& config) {
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
  ProcessGroups g = MakeSingleProcessGroups(config.stats);
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

  if (backend == Backend::kAuto) backend = Backend::kGloo;  // CPU: the only backend so far
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
      case Backend::kAuto:
      case Backend::kGloo:
        st = ConnectGlooGroups(config, store, &g);
        break;
    }
  }
  if (!st.ok()) {
    return absl::Status(st.code(), std::string(BackendName(backend)) + " rendezvous at " +
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
