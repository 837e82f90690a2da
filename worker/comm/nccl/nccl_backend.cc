#include "worker/comm/nccl/nccl_backend.h"

#include <nccl.h>

#if LATCHKEY_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstring>
#include <thread>
#include <vector>

#include "common/sha256.h"
#include "worker/comm/nccl/nccl_group.h"
#include "worker/device/cuda_runtime.h"

namespace latchkey::comm {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId is 128 bytes");

using SteadyClock = std::chrono::steady_clock;

// A communicator of `size` ranks over `id`, nonblocking, initialized within `timeout`.
absl::StatusOr<ncclComm_t> InitComm(const std::string& id_bytes, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  const auto deadline = SteadyClock::now() + timeout;
  while (r == ncclInProgress && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r == ncclSuccess) return comm;
  absl::Status st =
      r == ncclInProgress
          ? absl::DeadlineExceededError("ncclCommInitRankConfig: not every rank joined within " +
                                        std::to_string(timeout.count()) +
                                        " ms; communicator aborted [" + NcclVersionString() + "]")
          : NcclStatus(r, comm, "ncclCommInitRankConfig", __FILE__, __LINE__);
  if (comm != nullptr) (void)ncclCommAbort(comm);
  return st;
}

struct GroupPlan {
  std::string name;  // "world", "tp", "dp"
  std::string key;   // the rendezvous key: world, tp<dp_rank>, dp<tp_rank>
  int rank = 0;
  int size = 1;
  std::string id;
};

}  // namespace

absl::StatusOr<std::string> ExchangeNcclUniqueId(Store& store, int rank, int size,
                                                 std::chrono::milliseconds timeout) {
  std::string id;
  if (rank == 0) {
    ncclUniqueId uid;
    if (ncclResult_t r = ncclGetUniqueId(&uid); r != ncclSuccess) {
      return NcclStatus(r, nullptr, "ncclGetUniqueId", __FILE__, __LINE__);
    }
    id.assign(uid.internal, sizeof(uid.internal));
    if (absl::Status st = store.Set("nccl/id", std::vector<uint8_t>(id.begin(), id.end()));
        !st.ok()) {
      return st;
    }
  } else {
    absl::StatusOr<std::vector<uint8_t>> got = store.Get("nccl/id", timeout);
    if (!got.ok()) return got.status();
    id.assign(got->begin(), got->end());
  }
  if (id.size() != kNcclUniqueIdBytes) {
    return absl::InternalError("nccl unique id: got " + std::to_string(id.size()) +
                               " bytes from the rendezvous store, not " +
                               std::to_string(kNcclUniqueIdBytes));
  }
  // Every rank publishes the SHA-256 of what it got; rank 0 alone reads them all and publishes
  // its verdict, which the others read: 3 store operations per rank and `size` reads for rank
  // 0, where every rank reading every digest was size^2 reads at the one store (minutes at
  // 4096 ranks, docs/performance.md "Rendezvous at scale").
  const std::string mine = Sha256Hex(id);
  if (absl::Status st = store.Set("nccl/digest/" + std::to_string(rank),
                                  std::vector<uint8_t>(mine.begin(), mine.end()));
      !st.ok()) {
    return st;
  }
  if (rank != 0) {
    absl::StatusOr<std::vector<uint8_t>> verdict = store.Get("nccl/verdict", timeout);
    if (!verdict.ok()) return verdict.status();
    const std::string v(verdict->begin(), verdict->end());
    if (v != "ok") return absl::InternalError(v + " (rank 0's check)");
    return id;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("nccl/digest/" + std::to_string(r));
  if (absl::Status st = store.Wait(keys, timeout); !st.ok()) return st;
  std::string verdict = "ok";
  for (int r = 0; r < size && verdict == "ok"; ++r) {
    absl::StatusOr<std::vector<uint8_t>> d = store.Get(keys[r], timeout);
    if (!d.ok()) return d.status();
    const std::string theirs(d->begin(), d->end());
    if (theirs != mine) {
      verdict = "nccl unique id: rank " + std::to_string(r) + " got bytes with SHA-256 " + theirs +
                ", rank 0 got " + mine;
    }
  }
  if (absl::Status st =
          store.Set("nccl/verdict", std::vector<uint8_t>(verdict.begin(), verdict.end()));
      !st.ok()) {
    return st;
  }
  if (verdict != "ok") return absl::InternalError(verdict);
  return id;
}

absl::Status ConnectNcclGroups(const RendezvousConfig& config, std::shared_ptr<Store> store,
                               ProcessGroups* g) {
  std::vector<GroupPlan> plans = {{"world", "world", g->rank, g->world_size, {}}};
  if (g->tp > 1) plans.push_back({"tp", "tp" + std::to_string(g->dp_rank), g->tp_rank, g->tp, {}});
  if (g->dp > 1) plans.push_back({"dp", "dp" + std::to_string(g->tp_rank), g->dp_rank, g->dp, {}});
  std::string digests;
  for (GroupPlan& p : plans) {
    PrefixStore prefixed(config.prefix + "/" + p.key, store);
    absl::StatusOr<std::string> id =
        ExchangeNcclUniqueId(prefixed, p.rank, p.size, config.rendezvous_timeout);
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          "group '" + p.name + "': " + std::string(id.status().message()));
    }
    p.id = *std::move(id);
    digests += (digests.empty() ? "" : ", ") + p.name + " sha256 " + Sha256Hex(p.id).substr(0, 16);
  }
  // Rank 0 hosts the TCP store: it goes on (and may fail and take the store with it) only once
  // every rank has read every id it needs.
  {
    PrefixStore world(config.prefix + "/world", store);
    if (absl::Status st = world.Set("nccl/exchanged/" + std::to_string(g->rank), {1}); !st.ok()) {
      return st;
    }
    if (g->rank == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < g->world_size; ++r) keys.push_back("nccl/exchanged/" + std::to_string(r));
      if (absl::Status st = world.Wait(keys, config.rendezvous_timeout); !st.ok()) return st;
    }
  }
  // The communicators are formed on the config's device, made current here (the runner has
  // done so already unless its device check was skipped for a test).
  const int device = config.device.index;
  absl::Status usable = CudaDeviceCount().status();
  if (usable.ok()) usable = UseCudaDevice(device);
  if (!usable.ok()) {
    return absl::FailedPreconditionError(
        "nccl: unique ids agreed by every rank (" + digests +
        "), but no CUDA device for this rank: " + std::string(usable.message()));
  }
  for (const GroupPlan& p : plans) {
    absl::StatusOr<ncclComm_t> comm = InitComm(p.id, p.rank, p.size, config.rendezvous_timeout);
    if (!comm.ok()) {
      return absl::Status(comm.status().code(),
                          "group '" + p.name + "': " + std::string(comm.status().message()));
    }
    auto group = std::make_shared<NcclGroup>(p.name, p.rank, p.size, *comm, device, g->stats);
#if LATCHKEY_TORCH_CUDA
    // The stream the model's kernels run on: torch's current stream of the device.
    group->set_stream(
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
#endif
    if (p.name == "world") {
      g->world = group;
    } else if (p.name == "tp") {
      g->tp_group = group;
    } else {
      g->dp_group = group;
    }
  }
  return absl::OkStatus();
}

}  // namespace latchkey::comm
