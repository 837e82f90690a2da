#include "worker/comm/gloo/gloo_backend.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include "worker/comm/gloo/gloo_group.h"

namespace latchkey::comm {
namespace {

// A store failure, carried through gloo (which expects exceptions from its store).
struct StoreError : std::runtime_error {
  explicit StoreError(absl::Status s)
      : std::runtime_error(std::string(s.message())), status(std::move(s)) {}
  absl::Status status;
};

// gloo::rendezvous::Store over comm::Store.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::vector<uint8_t>(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->Get(key, timeout_);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { Check(store_->Wait(keys, timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(store_->Wait(keys, timeout));
  }

 private:
  static void Check(const absl::Status& st) {
    if (!st.ok()) throw StoreError(st);
  }

  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds timeout_;
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
    GlooStoreAdapter adapter(store, config.rendezvous_timeout);
    gloo::transport::tcp::attr attr;
    attr.hostname = LocalAddress(config);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto connect = [&](const std::string& key, int rank_in_group, int group_size) {
      gloo::rendezvous::PrefixStore prefixed(config.prefix + "/" + key, adapter);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_in_group, group_size);
      ctx->setTimeout(config.rendezvous_timeout);
      ctx->connectFullMesh(prefixed, device);
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
