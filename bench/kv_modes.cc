// K/V reduction modes side by side: per_micro_batch vs deferred vs coalesced on one TP group.
//
//   bench_kv_modes [--gas 8,32] [--steps N] [--layers 24] [--embd 256] [--heads 8] [--seq 128]
//                  [--tp 2]
//
// Started without RANK it launches itself once per rank (RANK/WORLD_SIZE/MASTER_PORT env) and
// rank 0 prints the table. One engine per GAS; the modes are interleaved window by window: each
// round runs every mode once, in an order shuffled per round (the same seeded order on every
// rank), so machine noise and warm caches hit every mode alike. The first round is warm-up.
// Per cell: the median step time with its min-max spread over the measured rounds, and the
// ratio to per_micro_batch taken within each round (median and min-max of those ratios).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/self_ranks.h"
#include "bench/stats.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "tests/support/tiny_model.h"
#include "worker/comm/process_groups.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace {

struct Args {
  std::vector<int> gas = {8, 32};
  int steps = 9;      // measured rounds (windows per mode and GAS) after one warm-up round
  unsigned seed = 1;  // order of the modes within each round
  int layers = 24, embd = 256, heads = 8, seq = 128, tp = 2;
};

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::atoi(s.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  return out;
}

latchkey::JobSpec Spec(const Args& a, int gas) {
  latchkey::JobSpec s;
  s.model = latchkey::testing::SmallModel(a.layers, a.embd, a.heads, a.seq);
  s.micro_batch_size = 1;
  s.gradient_accumulation_steps = gas;
  s.optimizer.type = latchkey::OptimizerType::kSgd;
  s.optimizer.lr = 0.01;
  s.tp = a.tp;
  s.world_size = a.tp;
  s.seq_len = a.seq;
  s.steps = 1000;
  s.data.synthetic_seed = 1;
  return s;
}

using latchkey::bench::Max;
using latchkey::bench::Median;
using latchkey::bench::Min;

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--gas")
      a.gas = ParseList(v);
    else if (k == "--steps")
      a.steps = std::atoi(v.c_str());
    else if (k == "--layers")
      a.layers = std::atoi(v.c_str());
    else if (k == "--embd")
      a.embd = std::atoi(v.c_str());
    else if (k == "--heads")
      a.heads = std::atoi(v.c_str());
    else if (k == "--seq")
      a.seq = std::atoi(v.c_str());
    else if (k == "--tp")
      a.tp = std::atoi(v.c_str());
    else if (k == "--seed")
      a.seed = static_cast<unsigned>(std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (std::getenv("RANK") == nullptr) return latchkey::bench::RunSelfAsRanks(argc, argv, a.tp);
  const int rank = std::atoi(std::getenv("RANK"));
  latchkey::ConfigureComputeThreads(a.tp);
  latchkey::comm::RendezvousConfig rdv;
  rdv.port = std::atoi(std::getenv("MASTER_PORT"));
  rdv.rank = rank;
  rdv.world_size = a.tp;
  rdv.tp = a.tp;
  auto groups = latchkey::comm::CreateProcessGroups(latchkey::CommBackend::kAuto, rdv);
  if (!groups.ok()) {
    std::fprintf(stderr, "%s\n", std::string(groups.status().message()).c_str());
    return 1;
  }
  const latchkey::KvMode modes[3] = {latchkey::KvMode::kPerMicroBatch, latchkey::KvMode::kDeferred,
                                     latchkey::KvMode::kCoalesced};
  if (rank == 0) {
    std::printf(
        "K/V modes: %d layers, n_embd %d, n_head %d (MQA), seq %d, micro-batch 1, TP %d, "
        "%d measured rounds per cell, modes in a shuffled order each round\n\n",
        a.layers, a.embd, a.heads, a.seq, a.tp, a.steps);
    std::printf(
        "| GAS | kv_mode | step s median (min-max) | tokens/s | K/V all-reduces/step | "
        "all collectives/step | vs per_micro_batch, per round: median (min-max) |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
  }
  for (int gas : a.gas) {
    latchkey::JobSpec spec = Spec(a, gas);
    auto engine = latchkey::CreateEngine(spec, &*groups);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
      return 1;
    }
    std::map<int, std::vector<double>> secs;
    std::map<int, int64_t> kv_calls, all_calls;
    std::mt19937 order_rng(a.seed);  // identical on every rank: all run the same mode per window
    int64_t m = 0;
    int64_t window = 0;
    for (int round = 0; round <= a.steps; ++round) {
      int order[3] = {0, 1, 2};
      std::shuffle(order, order + 3, order_rng);
      for (int k : order) {
        latchkey::LatchPolicy policy = latchkey::InitialPolicy(spec);
        latchkey::Latch latch = latchkey::DecideLatch(spec, policy, window++, m);
        latch.kv_mode = modes[k];  // the bench pins each window's mode
        auto r = (*engine)->RunWindow(latch);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
          return 1;
        }
        m += latch.n;
        if (round == 0) continue;  // warm-up
        secs[k].push_back(r->step_seconds);
        kv_calls[k] = r->kv_allreduce_calls;
        int64_t total = 0;
        for (const auto& [key, n] : r->collective_calls) total += n;
        all_calls[k] = total;
      }
    }
    for (int k = 0; k < 3; ++k) {
      std::vector<double> ratios;
      for (size_t i = 0; i < secs[k].size(); ++i) ratios.push_back(secs[k][i] / secs[0][i]);
      const double t = Median(secs[k]);
      if (rank == 0) {
        std::printf("| %d | %s | %.3f (%.3f-%.3f) | %.0f | %lld | %lld | %.3f (%.3f-%.3f) |\n", gas,
                    latchkey::KvModeName(modes[k]), t, Min(secs[k]), Max(secs[k]), gas * a.seq / t,
                    static_cast<long long>(kv_calls[k]), static_cast<long long>(all_calls[k]),
                    Median(ratios), Min(ratios), Max(ratios));
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
