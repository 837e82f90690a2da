#include "worker/comm/gloo/gloo_backend.h"

#include <arpa/inet.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include "worker/comm/gloo/gloo_group.h"
#include "worker/comm/mesh_exchange.h"

namespace latchkey::comm {
namespace {

// A store failure, carried through gloo (which expects exceptions from its store).
struct StoreError : std::runtime_error {
  explicit StoreError(absl::Status s)
      : std::runtime_error(std::string(s.message())), status(std::move(s)) {}
  absl::Status status;
};

// The port of a socket address, in host order, and the address's bytes with the port zeroed
// (as long as its family's sockaddr: the pair's host, the same for all of a rank's pairs).
uint16_t PortOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
}
size_t FamilySize(sa_family_t family) {
  if (family == AF_INET) return sizeof(sockaddr_in);
  if (family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}
void SetPort(sockaddr_storage* ss, uint16_t port) {
  if (ss->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(ss)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(ss)->sin6_port = htons(port);
  }
}

// A gloo context whose pairs are connected as a full mesh through the O(1)-requests-per-rank
// exchange of mesh_exchange.h, in place of gloo's connectFullMesh (N^2 store requests, N^3
// bytes: minutes past ~1,000 ranks). The pairs connect in peer order, as gloo's do.
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int rank, int size) : gloo::Context(rank, size) {}

  void Connect(comm::Store& store, const std::shared_ptr<gloo::transport::Device>& dev) {
    auto tctx = dev->createContext(rank, size);
    tctx->setTimeout(getTimeout());
    if (size > 1) {
      std::vector<uint16_t> ports(size, 0);
      std::vector<uint8_t> host;
      for (int j = 0; j < size; ++j) {
        if (j == rank) continue;
        const gloo::transport::tcp::Address self(tctx->createPair(j)->address().bytes());
        sockaddr_storage ss = self.getSockaddr();
        const size_t len = FamilySize(ss.ss_family);
        if (len == 0) throw std::runtime_error("gloo pair address of an unknown family");
        ports[j] = PortOf(ss);
        SetPort(&ss, 0);
        const auto* b = reinterpret_cast<const uint8_t*>(&ss);
        std::vector<uint8_t> h(b, b + len);
        if (host.empty()) {
          host = std::move(h);
        } else if (h != host) {
          throw std::runtime_error("gloo pairs of rank " + std::to_string(rank) +
                                   " listen on different addresses");
        }
      }
      auto peers = ExchangeMeshAddresses(store, rank, size, host, ports, getTimeout());
      if (!peers.ok()) throw StoreError(peers.status());
      for (int j = 0; j < size; ++j) {
        if (j == rank) continue;
        const std::vector<uint8_t>& h = peers->hosts[peers->host[j]];
        sockaddr_storage ss{};
        if (h.size() < sizeof(sa_family_t) || h.size() > sizeof(ss)) {
          throw StoreError(absl::DataLossError("rank " + std::to_string(j) + "'s gloo address is " +
                                               std::to_string(h.size()) + " bytes"));
        }
        std::memcpy(&ss, h.data(), h.size());
        if (FamilySize(ss.ss_family) != h.size()) {
          throw StoreError(absl::DataLossError("rank " + std::to_string(j) +
                                               "'s gloo address has a bad family"));
        }
        SetPort(&ss, peers->port[j]);
        tctx->getPair(j)->connect(gloo::transport::tcp::Address(ss).bytes());
      }
    }
    device_ = dev;
    transportContext_ = std::move(tctx);
  }
};

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string LocalAddress(const RendezvousConfig& config) {
  // Ranks that meet on a loopback address (or in one process) are all on this machine.
  if (config.store != nullptr || IsLoopback(config.host)) return "127.0.0.1";
  if (!config.local_address.empty()) return config.local_address;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != 0) return name;
  return "127.0.0.1";
}

}  // namespace

bool GlooBuiltIn() { return true; }

absl::Status ConnectGlooGroups(const RendezvousConfig& config, std::shared_ptr<Store> store,
                               ProcessGroups* g, GlooGroupMask mask) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = LocalAddress(config);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto connect = [&](const std::string& key, int rank_in_group, int group_size) {
      PrefixStore prefixed(config.prefix + "/" + key, store);
      auto ctx = std::make_shared<MeshContext>(rank_in_group, group_size);
      ctx->setTimeout(config.rendezvous_timeout);
      ctx->Connect(prefixed, device);
      return ctx;
    };
    if (mask.world) {
      g->world = MakeGlooGroup("world", connect("world", g->rank, g->world_size), g->stats);
    }
    if (g->tp > 1 && mask.tp) {
      g->tp_group = MakeGlooGroup(
          "tp", connect("tp" + std::to_string(g->dp_rank), g->tp_rank, g->tp), g->stats);
    }
    if (g->dp > 1 && mask.dp) {
      g->dp_group = MakeGlooGroup(
          "dp", connect("dp" + std::to_string(g->tp_rank), g->dp_rank, g->dp), g->stats);
    }
  } catch (const StoreError& e) {
    return e.status;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return absl::UnavailableError(what);
  }
  return absl::OkStatus();
}

}  // namespace latchkey::comm
