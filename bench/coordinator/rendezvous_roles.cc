// bench_rendezvous's child processes: the store's host, a share of the store clients, a share
// of the ranks that join the coordinator and exchange the NCCL unique id (rendezvous_roles.h).
#include "bench/coordinator/rendezvous_roles.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "worker/comm/mesh_exchange.h"
#include "worker/comm/nccl/nccl_backend.h"
#include "worker/comm/store.h"
#include "worker/session/worker_session.h"

namespace latchkey::bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double UsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// What every thread of a child collects, merged under `mu`.
struct Collected {
  std::mutex mu;
  std::map<std::string, LatencyHist> hist;
  std::vector<RankTimes> times;
  std::vector<std::string> extra;  // "id <rank> <sha256>" lines
  std::string first_error;
  void Fail(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = e;
  }
  void Merge(const std::map<std::string, LatencyHist>& mine) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [op, h] : mine) hist[op].Merge(h);
  }
  int Write(const std::string& path) {
    std::ofstream out(path);
    for (size_t i = 0; i < times.size(); ++i) {
      const RankTimes& t = times[i];
      out << "t " << i << " " << t.start_ns << " " << t.connected_ns << " " << t.done_ns << " "
          << (t.ok ? 1 : 0) << "\n";
    }
    for (const auto& [op, h] : hist) out << h.Lines(op);
    for (const std::string& l : extra) out << l << "\n";
    if (!first_error.empty()) out << "err " << first_error << "\n";
    out.close();
    return out ? 0 : 1;
  }
};

// A store that times each request into the rank's histograms ("set", "get", "wait"), so the
// mesh exchange's requests are counted and timed like the other patterns'.
class TimedStore final : public comm::Store {
 public:
  TimedStore(comm::Store& base, std::map<std::string, LatencyHist>* h) : base_(base), h_(h) {}
  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    const auto at = Clock::now();
    absl::Status st = base_.Set(key, value);
    (*h_)["set"].Add(UsSince(at));
    return st;
  }
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override {
    const auto at = Clock::now();
    auto v = base_.Get(key, timeout);
    (*h_)["get"].Add(UsSince(at));
    return v;
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    const auto at = Clock::now();
    absl::Status st = base_.Wait(keys, timeout);
    (*h_)["wait"].Add(UsSince(at));
    return st;
  }

 private:
  comm::Store& base_;
  std::map<std::string, LatencyHist>* h_;
};

std::string Describe(int rank, const absl::Status& st) {
  return "rank " + std::to_string(rank) + ": " + st.ToString();
}

// One rank of the store pattern. Returns an error description, empty on success.
std::string StoreRank(const StoreClientArgs& a, int rank, Clock::time_point deadline,
                      std::map<std::string, LatencyHist>* h, RankTimes* t) {
  const auto timeout = std::chrono::milliseconds(a.timeout_s * 1000);
  const int group = rank / a.group;
  const std::string base = "g" + std::to_string(group) + "/";
  t->start_ns = NowNs();
  auto at = Clock::now();
  auto store = comm::ConnectTcpStore("127.0.0.1", a.port, false, a.world, timeout);
  if (!store.ok()) return Describe(rank, store.status());
  (*h)["connect"].Add(UsSince(at));
  t->connected_ns = NowNs();
  if (a.read == "mesh") {
    // The gloo backend's own exchange (mesh_exchange.h), with what a rank of 8 ranks a host
    // would publish: its host's 16-byte address and a port for each peer, all checked.
    const int me = rank % a.group, n = a.group;
    auto host_of = [](int r) {
      std::string h = "host-" + std::to_string(r / 8);
      h.resize(16, '\0');
      return Bytes(h);
    };
    auto port = [](int from, int to) { return static_cast<uint16_t>((from * 7 + to) % 65536); };
    std::vector<uint16_t> ports(n);
    for (int i = 0; i < n; ++i) ports[i] = port(me, i);
    comm::PrefixStore scoped("g" + std::to_string(group), *store);
    TimedStore timed(scoped, h);
    auto peers = comm::ExchangeMeshAddresses(timed, me, n, host_of(group * n + me), ports, timeout);
    if (!peers.ok()) return Describe(rank, peers.status());
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      if (peers->port[j] != port(j, me) || peers->hosts[peers->host[j]] != host_of(group * n + j)) {
        return "rank " + std::to_string(rank) + ": peer " + std::to_string(j) +
               "'s endpoint is wrong";
      }
    }
    t->done_ns = NowNs();
    t->ok = true;
    return "";
  }
  at = Clock::now();
  absl::Status st =
      (*store)->Set(base + "addr/" + std::to_string(rank % a.group), Bytes(RankAddress(rank)));
  if (!st.ok()) return Describe(rank, st);
  (*h)["set"].Add(UsSince(at));
  std::vector<std::string> keys;
  for (int j = 0; j < a.group; ++j) keys.push_back(base + "addr/" + std::to_string(j));
  auto expect = [&](int j) { return RankAddress(group * a.group + j); };
  auto read_each = [&](std::string* blob) -> std::string {
    at = Clock::now();
    if (absl::Status w = (*store)->Wait(keys, timeout); !w.ok()) return Describe(rank, w);
    (*h)["wait"].Add(UsSince(at));
    for (int j = 0; j < a.group; ++j) {
      if ((j & 63) == 0 && Clock::now() > deadline) {
        return "rank " + std::to_string(rank) + ": past the deadline after " + std::to_string(j) +
               " of " + std::to_string(a.group) + " gets";
      }
      at = Clock::now();
      auto v = (*store)->Get(keys[j], timeout);
      if (!v.ok()) return Describe(rank, v.status());
      (*h)["get"].Add(UsSince(at));
      const std::string got(v->begin(), v->end());
      if (got != expect(j)) return "rank " + std::to_string(rank) + ": " + keys[j] + " = " + got;
      if (blob != nullptr) *blob += got + "\n";
    }
    return "";
  };
  std::string err;
  if (a.read == "each") {
    err = read_each(nullptr);
  } else if (rank % a.group == 0) {  // gathered: the group's first rank reads and republishes
    std::string blob;
    err = read_each(&blob);
    if (err.empty()) {
      at = Clock::now();
      st = (*store)->Set(base + "all", Bytes(blob));
      if (!st.ok()) return Describe(rank, st);
      (*h)["set"].Add(UsSince(at));
    }
  } else {
    at = Clock::now();
    auto v = (*store)->Get(base + "all", timeout);
    if (!v.ok()) return Describe(rank, v.status());
    (*h)["get"].Add(UsSince(at));
    std::vector<std::string> got = absl::StrSplit(std::string(v->begin(), v->end()), '\n');
    if (static_cast<int>(got.size()) != a.group + 1) {
      return "rank " + std::to_string(rank) + ": gathered " + std::to_string(got.size() - 1) +
             " addresses, not " + std::to_string(a.group);
    }
    for (int j = 0; j < a.group; ++j) {
      if (got[j] != expect(j)) return "rank " + std::to_string(rank) + ": gathered " + got[j];
    }
  }
  if (!err.empty()) return err;
  t->done_ns = NowNs();
  t->ok = true;
  return "";
}

}  // namespace

int RunStoreHost(int port, int world, int timeout_s) {
  RaiseFdLimit();
  auto store = comm::ConnectTcpStore("127.0.0.1", port, true, world,
                                     std::chrono::milliseconds(timeout_s * 1000));
  if (!store.ok()) {
    std::cerr << "store host: " << store.status() << "\n";
    return 1;
  }
  std::cout << "ready" << std::endl;
  for (;;) pause();  // until the parent's SIGTERM
}

int RunStoreClients(const StoreClientArgs& a) {
  RaiseFdLimit();
  Collected c;
  c.times.resize(a.count);
  const auto deadline = Clock::now() + std::chrono::seconds(a.timeout_s);
  std::vector<std::thread> threads;
  threads.reserve(a.count);
  for (int i = 0; i < a.count; ++i) {
    threads.emplace_back([&, i] {
      std::map<std::string, LatencyHist> mine;
      const std::string err = StoreRank(a, a.first + i, deadline, &mine, &c.times[i]);
      if (!err.empty()) c.Fail(err);
      c.Merge(mine);
    });
  }
  for (auto& t : threads) t.join();
  return c.Write(a.out);
}

int RunUniqueIdRanks(const UniqueIdArgs& a) {
  RaiseFdLimit();
  Collected c;
  c.times.resize(a.count);
  // Each rank's store outlives its thread and the stores go one at a time, rank 0's (the
  // host) last: 1,024 c10d clients destroyed at once (each joins its worker thread) stalled a
  // process for minutes in 3 of 24 runs (every joining thread waiting in glibc's
  // __nptl_deallocate_stack on the stack cache's lock).
  std::vector<std::shared_ptr<comm::Store>> stores(a.count);
  const auto timeout = std::chrono::milliseconds(a.timeout_s * 1000);
  std::vector<std::thread> threads;
  threads.reserve(a.count);
  for (int i = 0; i < a.count; ++i) {
    threads.emplace_back([&, i] {
      const int want = a.first + i;
      std::map<std::string, LatencyHist> h;
      RankTimes& t = c.times[i];
      t.start_ns = NowNs();
      auto at = Clock::now();
      WorkerSessionOptions o;
      o.coordinator = a.coordinator;
      o.job_id = a.job_id;
      o.join_token = a.join_token;
      o.worker_id = "rendezvous-bench-" + std::to_string(want);
      o.requested_rank = want;
      o.heartbeat = false;  // the coordinator runs with a long liveness timeout
      o.rpc_timeout = absl::Seconds(a.timeout_s);
      auto session = WorkerSession::Join(o);
      if (!session.ok()) return c.Fail(Describe(want, session.status()));
      h["join"].Add(UsSince(at));
      const JoinInfo& info = (*session)->info();
      // As the worker does: rank 0 hosts the TCP store the coordinator named, the others
      // connect; the world group's keys live under the attempt's prefix.
      at = Clock::now();
      auto store = comm::ConnectTcpStore(info.rendezvous_host, info.rendezvous_port, info.rank == 0,
                                         info.world_size, timeout);
      if (!store.ok()) return c.Fail(Describe(info.rank, store.status()));
      stores[i] = *store;
      h["connect"].Add(UsSince(at));
      t.connected_ns = NowNs();
      comm::PrefixStore world(info.rendezvous_prefix + "/world", *store);
      at = Clock::now();
      auto id = comm::ExchangeNcclUniqueId(world, info.rank, info.world_size, timeout);
      if (!id.ok()) return c.Fail(Describe(info.rank, id.status()));
      h["exchange"].Add(UsSince(at));
      t.done_ns = NowNs();
      // As ConnectNcclGroups: rank 0 (the store's host) leaves once every rank has its id.
      if (absl::Status st = world.Set("nccl/exchanged/" + std::to_string(info.rank), {1});
          !st.ok()) {
        return c.Fail(Describe(info.rank, st));
      }
      if (info.rank == 0) {
        std::vector<std::string> keys;
        for (int r = 0; r < info.world_size; ++r) {
          keys.push_back("nccl/exchanged/" + std::to_string(r));
        }
        if (absl::Status st = world.Wait(keys, timeout); !st.ok()) {
          return c.Fail(Describe(info.rank, st));
        }
      }
      t.ok = true;
      c.Merge(h);
      std::lock_guard<std::mutex> lock(c.mu);
      c.extra.push_back("id " + std::to_string(info.rank) + " " + std::to_string(id->size()) + " " +
                        Sha256Hex(*id));
    });
  }
  for (auto& t : threads) t.join();
  while (!stores.empty()) stores.pop_back();
  return c.Write(a.out);
}

}  // namespace latchkey::bench
