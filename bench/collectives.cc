// Collective latency and bandwidth per backend, side by side, on ranks of this machine.
//
//   bench_collectives [--ranks 2,4] [--backends gloo,shm] [--ops all_reduce,all_gather,broadcast]
//                     [--max-bytes 16777216] [--rounds 7] [--quick]
//
// Started without RANK it launches itself once per rank for each world size in --ranks (real
// processes, RANK/WORLD_SIZE/MASTER_PORT env), and rank 0 prints the table. Every rank forms the
// process groups of every backend (comm::CreateProcessGroups with that CommBackend value, each
// under its own key prefix of one TCP store). Sizes go from 4 B to --max-bytes in steps of 4x. For
// each op and size, each round runs every backend once, in an order shuffled per round (the same
// seeded order on every rank), so machine noise hits every backend alike; a round is a barrier, a
// few warm-up calls, then a timed loop of calls. A cell is the median time per call over the rounds
// with its min-max spread, and the algorithm bandwidth (payload bytes / time per call). Every
// all-reduce result is checked, so a broken transport never reports a number.
// --quick: sizes up to 64 KiB, 3 rounds, short loops (the smoke test).
// Default --backends: every one of gloo and shm that this build knows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/self_ranks.h"
#include "bench/stats.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/store.h"

namespace {

using latchkey::bench::Max;
using latchkey::bench::Median;
using latchkey::bench::Min;
namespace comm = latchkey::comm;
using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> backends;
  std::vector<std::string> ops = {"all_reduce"};
  size_t max_bytes = size_t{16} << 20;
  int rounds = 7;
  bool quick = false;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::string Bytes(size_t b) {
  if (b >= (size_t{1} << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

// Calls per timed loop: about 50 ms of gloo at this size, within [3, 400] (quick: [2, 50]).
int Iterations(size_t bytes, bool quick) {
  const double est_us = 250.0 + static_cast<double>(bytes) / 400.0;  // ~400 MB/s over loopback
  const int n = static_cast<int>(50000.0 / est_us);
  return quick ? std::clamp(n / 8, 2, 50) : std::clamp(n, 3, 400);
}

struct Runner {
  comm::ProcessGroups* g;
  std::vector<float> data, out;

  absl::Status Once(const std::string& op, size_t count) {
    comm::Group& w = *g->world;
    const comm::Buffer in = comm::HostBuffer(data.data(), count);
    if (op == "all_reduce") return w.AllReduceSum(in);
    if (op == "broadcast") return w.Broadcast(in, 0);
    if (op == "all_gather") {
      return w.AllGather(in, comm::HostBuffer(out.data(), count * g->world_size));
    }
    return absl::InvalidArgumentError("--ops: unknown op '" + op + "'");
  }
  // One all-reduce of rank+1 everywhere must give world*(world+1)/2.
  absl::Status Check(size_t count) {
    std::fill(data.begin(), data.begin() + count, static_cast<float>(g->rank + 1));
    if (absl::Status st = g->world->AllReduceSum(comm::HostBuffer(data.data(), count)); !st.ok()) {
      return st;
    }
    const float want = g->world_size * (g->world_size + 1) / 2.0f;
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != want) {
        return absl::DataLossError("all_reduce element " + std::to_string(i) + " is " +
                                   std::to_string(data[i]) + ", want " + std::to_string(want));
      }
    }
    return absl::OkStatus();
  }
  // Seconds per call over a timed loop of n calls after a barrier and 2 warm-up calls.
  absl::StatusOr<double> Time(const std::string& op, size_t count, int n) {
    if (absl::Status st = g->world->Barrier(); !st.ok()) return st;
    for (int i = 0; i < 2; ++i) {
      if (absl::Status st = Once(op, count); !st.ok()) return st;
    }
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (absl::Status st = Once(op, count); !st.ok()) return st;
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / n;
  }
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "bench_collectives: %s\n", std::string(st.message()).c_str());
  return 1;
}

int RunRank(const Args& a) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  const int port = std::atoi(std::getenv("MASTER_PORT"));
  auto store = comm::ConnectTcpStore("127.0.0.1", port, rank == 0, world, std::chrono::seconds(60));
  if (!store.ok()) return Fail(store.status());
  std::vector<comm::ProcessGroups> groups;
  for (const std::string& name : a.backends) {
    comm::RendezvousConfig rdv;
    rdv.rank = rank;
    rdv.world_size = world;
    rdv.tp = world;
    rdv.store = *store;
    rdv.prefix = "bench-" + name;
    auto g = comm::CreateProcessGroups(*latchkey::ParseCommBackend(name), rdv);
    if (!g.ok()) return Fail(g.status());
    groups.push_back(*std::move(g));
  }
  const size_t max_count = std::max<size_t>(1, a.max_bytes / sizeof(float));
  std::vector<Runner> runners;
  for (auto& g : groups) {
    runners.push_back(
        {&g, std::vector<float>(max_count, 1.0f), std::vector<float>(max_count * world, 0.0f)});
  }
  const size_t nb = a.backends.size();
  if (rank == 0) {
    std::printf(
        "\n%d ranks (processes on this machine), %d rounds per cell, backends in a "
        "shuffled order each round; time per call: median (min-max); bandwidth: "
        "payload bytes / median time\n\n| op | bytes |",
        world, a.rounds);
    for (const auto& b : a.backends) std::printf(" %s us | %s GB/s |", b.c_str(), b.c_str());
    if (nb > 1) std::printf(" %s / %s time |", a.backends.back().c_str(), a.backends[0].c_str());
    std::printf("\n|---|---|");
    for (size_t i = 0; i < nb; ++i) std::printf("---|---|");
    std::printf(nb > 1 ? "---|\n" : "\n");
  }
  std::mt19937 order_rng(1);  // the same on every rank: every rank runs the same backend
  for (const std::string& op : a.ops) {
    for (size_t bytes = 4; bytes <= a.max_bytes; bytes *= 4) {
      const size_t count = std::max<size_t>(1, bytes / sizeof(float));
      for (Runner& r : runners) {
        if (absl::Status st = r.Check(count); !st.ok()) return Fail(st);
      }
      std::vector<std::vector<double>> secs(nb);
      const int n = Iterations(bytes, a.quick);
      for (int round = 0; round < a.rounds; ++round) {
        std::vector<size_t> order(nb);
        for (size_t i = 0; i < nb; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), order_rng);
        for (size_t i : order) {
          auto t = runners[i].Time(op, count, n);
          if (!t.ok()) return Fail(t.status());
          secs[i].push_back(*t);
        }
      }
      if (rank != 0) continue;
      std::printf("| %s | %s |", op.c_str(), Bytes(bytes).c_str());
      for (size_t i = 0; i < nb; ++i) {
        const double m = Median(secs[i]);
        std::printf(" %.1f (%.1f-%.1f) | %.3g |", m * 1e6, Min(secs[i]) * 1e6, Max(secs[i]) * 1e6,
                    static_cast<double>(count * sizeof(float)) / m / 1e9);
      }
      if (nb > 1) std::printf(" %.3f |", Median(secs[nb - 1]) / Median(secs[0]));
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--quick") {
      a.quick = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_collectives: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (k == "--ranks") {
      a.ranks.clear();
      for (const auto& s : Split(v)) a.ranks.push_back(std::atoi(s.c_str()));
    } else if (k == "--backends") {
      a.backends = Split(v);
    } else if (k == "--ops") {
      a.ops = Split(v);
    } else if (k == "--max-bytes") {
      a.max_bytes = static_cast<size_t>(std::atoll(v.c_str()));
    } else if (k == "--rounds") {
      a.rounds = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "bench_collectives: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (a.quick) {
    a.max_bytes = std::min<size_t>(a.max_bytes, 64 << 10);
    a.rounds = std::min(a.rounds, 3);
  }
  if (a.backends.empty()) {
    for (const char* b : {"gloo", "shm"}) {
      if (latchkey::ParseCommBackend(b)) a.backends.push_back(b);
    }
  }
  for (const std::string& b : a.backends) {
    if (!latchkey::ParseCommBackend(b)) {
      std::fprintf(stderr, "bench_collectives: --backends: this build has no backend '%s'\n",
                   b.c_str());
      return 2;
    }
  }
  for (const std::string& op : a.ops) {
    if (op != "all_reduce" && op != "all_gather" && op != "broadcast") {
      std::fprintf(stderr, "bench_collectives: --ops: unknown op '%s'\n", op.c_str());
      return 2;
    }
  }
  if (std::getenv("RANK") != nullptr) return RunRank(a);
  int rc = 0;
  for (int world : a.ranks) {
    if (latchkey::bench::RunSelfAsRanks(argc, argv, world) != 0) rc = 1;
  }
  return rc;
}
