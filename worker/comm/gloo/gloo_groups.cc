#include "worker/comm/gloo/gloo_groups.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace latchkey::comm {
namespace {

// gloo::rendezvous::Store over c10d::TCPStore (the only c10d use in latchkey).
class TcpStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit TcpStoreAdapter(c10::intrusive_ptr<c10d::TCPStore> store,
                           std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    auto v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
void SetSum(gloo::AllreduceOptions& opts) {
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
}

class GlooGroup final : public Group {
 public:
  GlooGroup(std::string name, std::shared_ptr<gloo::Context> ctx,
            std::shared_ptr<CollectiveStats> stats)
      : Group(std::move(name), ctx->rank, ctx->size, std::move(stats)), ctx_(std::move(ctx)) {}

 protected:
  absl::Status DoAllReduceSum(void* data, size_t count, DataType type,
                              std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::AllreduceOptions opts(ctx_);
      opts.setTimeout(timeout);
      if (type == DataType::kFloat32) {
        opts.setOutput(static_cast<float*>(data), count);
        SetSum<float>(opts);
      } else {
        opts.setOutput(static_cast<double*>(data), count);
        SetSum<double>(opts);
      }
      gloo::allreduce(opts);
    });
  }

  absl::Status DoAllGather(const void* in, void* out, size_t count, DataType type,
                           std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setTimeout(timeout);
      const size_t total = count * static_cast<size_t>(size());
      const bool in_place = static_cast<const char*>(in) ==
                            static_cast<const char*>(out) + rank() * count * DataTypeSize(type);
      if (in_place) {
        // gloo's in-place form: no input buffer, this rank's chunk already sits in `out`.
        if (type == DataType::kFloat32) {
          opts.setOutput(static_cast<float*>(out), total);
        } else if (type == DataType::kBFloat16) {
          opts.setOutput(static_cast<uint16_t*>(out), total);
        } else {
          opts.setOutput(static_cast<double*>(out), total);
        }
      } else if (type == DataType::kFloat32) {
        opts.setInput(const_cast<float*>(static_cast<const float*>(in)), count);
        opts.setOutput(static_cast<float*>(out), total);
      } else if (type == DataType::kBFloat16) {
        opts.setInput(const_cast<uint16_t*>(static_cast<const uint16_t*>(in)), count);
        opts.setOutput(static_cast<uint16_t*>(out), total);
      } else {
        opts.setInput(const_cast<double*>(static_cast<const double*>(in)), count);
        opts.setOutput(static_cast<double*>(out), total);
      }
      gloo::allgather(opts);
    });
  }

  // Ring reduce-scatter over unbound buffers: size-1 steps; at step s this rank sends its partial
  // sum of chunk (r-s-1) to the next rank and adds the previous rank's partial of chunk (r-s-2);
  // after the last step it holds the full sum of chunk r.
  absl::Status DoReduceScatterSum(const void* in, void* out, size_t count, DataType type,
                                  std::chrono::milliseconds timeout) override {
    return Guard([&] {
      const size_t esize = DataTypeSize(type);
      const int n = size();
      const int r = rank();
      const size_t chunk_bytes = count * esize;
      // In place when `out` is this rank's chunk of `in`: reduce inside `in` itself.
      const bool in_place =
          static_cast<char*>(out) == static_cast<const char*>(in) + r * chunk_bytes;
      std::vector<char> copy;
      if (!in_place) {
        copy.assign(static_cast<const char*>(in), static_cast<const char*>(in) + chunk_bytes * n);
      }
      char* work = in_place ? static_cast<char*>(const_cast<void*>(in)) : copy.data();
      std::vector<char> incoming(chunk_bytes);
      auto send_buf = ctx_->createUnboundBuffer(work, chunk_bytes * n);
      auto recv_buf = ctx_->createUnboundBuffer(incoming.data(), incoming.size());
      const int next = (r + 1) % n;
      const int prev = (r - 1 + n) % n;
      const uint64_t slot = ctx_->nextSlot();
      for (int s = 0; s < n - 1; ++s) {
        const int send_chunk = ((r - s - 1) % n + n) % n;
        const int recv_chunk = ((r - s - 2) % n + n) % n;
        send_buf->send(next, slot, send_chunk * chunk_bytes, chunk_bytes);
        recv_buf->recv(prev, slot, 0, chunk_bytes);
        recv_buf->waitRecv(timeout);
        send_buf->waitSend(timeout);
        char* dst = work + recv_chunk * chunk_bytes;
        if (type == DataType::kFloat32) {
          Add(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(incoming.data()),
              count);
        } else {
          Add(reinterpret_cast<double*>(dst), reinterpret_cast<const double*>(incoming.data()),
              count);
        }
      }
      if (!in_place) std::memcpy(out, work + r * chunk_bytes, chunk_bytes);
    });
  }

  absl::Status DoBroadcast(void* data, size_t count, DataType type, int root,
                           std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setTimeout(timeout);
      opts.setRoot(root);
      if (type == DataType::kFloat32) {
        opts.setOutput(static_cast<float*>(data), count);
      } else if (type == DataType::kBFloat16) {
        opts.setOutput(static_cast<uint16_t*>(data), count);
      } else {
        opts.setOutput(static_cast<double*>(data), count);
      }
      gloo::broadcast(opts);
    });
  }

  absl::Status DoBarrier(std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  static void Add(T* dst, const T* src, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  // Gloo reports timeouts and peer failures as exceptions; they become a Status here.
  template <typename Fn>
  static absl::Status Guard(Fn&& fn) {
    try {
      fn();
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      const std::string what = e.what();
      if (what.find("imed out") != std::string::npos) return absl::DeadlineExceededError(what);
      return absl::UnavailableError(what);
    } catch (const std::exception& e) {
      return absl::InternalError(e.what());
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
};

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string LocalAddress(const RendezvousConfig& config) {
  if (!config.local_address.empty()) return config.local_address;
  if (IsLoopback(config.host)) return "127.0.0.1";
  if (const char* env = std::getenv("LATCHKEY_GLOO_HOSTNAME"); env && *env) return env;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != 0) return name;
  return "127.0.0.1";
}

}  // namespace

absl::StatusOr<ProcessGroups> CreateGlooProcessGroups(const RendezvousConfig& config) {
  if (config.world_size < 1 || config.tp < 1 || config.world_size % config.tp != 0) {
    return absl::InvalidArgumentError("latchkey.world_size: " + std::to_string(config.world_size) +
                                      " is not a positive multiple of tensor_parallel.autotp_size " +
                                      std::to_string(config.tp));
  }
  if (config.rank < 0 || config.rank >= config.world_size) {
    return absl::InvalidArgumentError("RANK: " + std::to_string(config.rank) +
                                      " outside [0, WORLD_SIZE=" +
                                      std::to_string(config.world_size) + ")");
  }
  ProcessGroups g;
  g.rank = config.rank;
  g.world_size = config.world_size;
  g.tp = config.tp;
  g.dp = config.world_size / config.tp;
  g.tp_rank = config.rank % config.tp;
  g.dp_rank = config.rank / config.tp;
  g.stats = std::make_shared<CollectiveStats>();
  if (config.world_size == 1) {
    g.world = std::make_shared<SingleRankGroup>("world", g.stats);
    g.tp_group = std::make_shared<SingleRankGroup>("tp", g.stats);
    g.dp_group = std::make_shared<SingleRankGroup>("dp", g.stats);
    return g;
  }
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(config.port);
    opts.isServer = config.rank == 0;
    opts.numWorkers = static_cast<size_t>(config.world_size);
    opts.waitWorkers = false;
    opts.timeout = config.rendezvous_timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(config.host, opts);
    auto store_holder = std::make_shared<TcpStoreAdapter>(tcp, config.rendezvous_timeout);
    TcpStoreAdapter& store = *store_holder;
    g.rendezvous = store_holder;

    gloo::transport::tcp::attr attr;
    attr.hostname = LocalAddress(config);
    auto device = gloo::transport::tcp::CreateDevice(attr);

    auto connect = [&](const std::string& key, int rank_in_group,
                       int group_size) -> std::shared_ptr<gloo::Context> {
      gloo::rendezvous::PrefixStore prefixed(config.prefix + "/" + key, store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_in_group, group_size);
      ctx->setTimeout(config.rendezvous_timeout);
      ctx->connectFullMesh(prefixed, device);
      return ctx;
    };
    // Same order on every rank: world, then TP, then DP.
    g.world = std::make_shared<GlooGroup>("world", connect("world", g.rank, g.world_size), g.stats);
    if (g.tp > 1) {
      g.tp_group = std::make_shared<GlooGroup>(
          "tp", connect("tp" + std::to_string(g.dp_rank), g.tp_rank, g.tp), g.stats);
    } else {
      g.tp_group = std::make_shared<SingleRankGroup>("tp", g.stats);
    }
    if (g.dp > 1) {
      g.dp_group = std::make_shared<GlooGroup>(
          "dp", connect("dp" + std::to_string(g.tp_rank), g.dp_rank, g.dp), g.stats);
    } else {
      g.dp_group = std::make_shared<SingleRankGroup>("dp", g.stats);
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (std::getenv("LATCHKEY_DEBUG") == nullptr) {
      if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    }
    return absl::UnavailableError("rendezvous at " + config.host + ":" +
                                  std::to_string(config.port) + " (rank " +
                                  std::to_string(config.rank) + "): " + what);
  }
  for (Group* grp : {g.world.get(), g.tp_group.get(), g.dp_group.get()}) {
    grp->set_default_timeout(config.collective_timeout);
  }
  return g;
}

}  // namespace latchkey::comm
