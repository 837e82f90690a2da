// Activation and peak memory per mode, measured by the ranks' memory accounting
// (worker/memory/memory.h), next to Korthikanti et al.'s formula in the run's element sizes
// (worker/memory/activation_formula.h, derived in docs/memory.md), and the step time.
//
//   bench_memory [--layers 8] [--embd 1024] [--heads 16] [--seq 1024] [--mb 1] [--tp 2]
//                [--reps 3] [--dropout 0] [--zero-tp 2] [--zero-seq 256] [--zero-gas 4]
//                [--no-zero]
//
// Started without RANK it launches itself once per rank (RANK/WORLD_SIZE/MASTER_PORT env),
// twice: the modes table on TP ranks, then the ZeRO table on DP 2 x zero-tp ranks; rank 0
// prints. Modes table: activation_checkpointing none / selective / full x sequence_parallel
// off / on, one engine per mode with n_layer layers and one with 1 layer, all alive at once,
// each with its own memory account. Measured activation bytes per layer =
// (activation_memory_bytes(n_layer) - activation_memory_bytes(1)) / (n_layer - 1): the
// embedding, the final LayerNorm, the logits and the loss are the same in both and cancel. Peak:
// the n_layer engine's peak_memory_bytes (its parameters, gradients and activations). Step
// time: the modes alternate window by window, `reps` measured rounds after one warm-up round;
// median (min-max), and the ratio to none without SP within each round. ZeRO table: stage 1 vs
// 2 with every micro-batch synchronised (latchkey.no_sync all false); the gradient-related peak
// is peak_memory_bytes - parameter bytes - optimizer state bytes - activation_memory_bytes.
// A mode this worker refuses (UNIMPLEMENTED) prints a "not available in this build" row.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/self_ranks.h"
#include "bench/stats.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "tests/support/tiny_model.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/process_groups.h"
#include "worker/memory/activation_formula.h"
#include "worker/model/param_store.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace {

using latchkey::bench::Max;
using latchkey::bench::Median;
using latchkey::bench::Min;

struct Args {
  int layers = 8, embd = 1024, heads = 16, seq = 1024, mb = 1, tp = 2, reps = 3;
  double dropout = 0.0;
  int zero_tp = 2, zero_seq = 256, zero_gas = 4;
  bool zero = true;
  std::string phase;  // "modes" or "zero" in a rank; "" in the launcher
};

struct Mode {
  latchkey::RecomputeMode recompute;
  bool sp;
};

const Mode kModes[] = {
    {latchkey::RecomputeMode::kNone, false},     {latchkey::RecomputeMode::kSelective, false},
    {latchkey::RecomputeMode::kFull, false},     {latchkey::RecomputeMode::kNone, true},
    {latchkey::RecomputeMode::kSelective, true}, {latchkey::RecomputeMode::kFull, true}};

latchkey::JobSpec BaseSpec(const Args& a, int layers, int seq, int tp, int world, int gas) {
  latchkey::JobSpec s;
  s.model = latchkey::testing::SmallModel(layers, a.embd, a.heads, seq);
  s.model.attn_pdrop = s.model.resid_pdrop = s.model.embd_pdrop = a.dropout;
  s.micro_batch_size = a.mb;
  s.gradient_accumulation_steps = gas;
  s.optimizer.type = latchkey::OptimizerType::kSgd;
  s.optimizer.lr = 1e-4;
  s.tp = tp;
  s.world_size = world;
  s.seq_len = seq;
  s.steps = 1000000;
  s.data.synthetic_seed = 1;
  return s;
}

std::string MiB(double bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", bytes / (1 << 20));
  return b;
}

// One engine per spec, or why it is not available.
struct Slot {
  std::unique_ptr<latchkey::Engine> engine;
  std::string unavailable;  // "" when the engine runs
  int64_t window = 0, micro_batch = 0;
  latchkey::JobSpec spec;
};

Slot Make(const latchkey::JobSpec& spec, latchkey::comm::ProcessGroups* g) {
  Slot s;
  s.spec = spec;
  auto e = latchkey::CreateEngine(spec, g);
  if (e.ok()) {
    s.engine = *std::move(e);
  } else if (e.status().code() == absl::StatusCode::kUnimplemented) {
    s.unavailable = std::string(e.status().message());
  } else {
    std::fprintf(stderr, "%s\n", std::string(e.status().message()).c_str());
    std::exit(1);
  }
  return s;
}

latchkey::StepReport Run(Slot& s) {
  latchkey::LatchPolicy policy = latchkey::InitialPolicy(s.spec);
  latchkey::Latch latch = latchkey::DecideLatch(s.spec, policy, s.window++, s.micro_batch);
  s.micro_batch += latch.n;
  auto r = s.engine->RunWindow(latch);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
    std::exit(1);
  }
  return *r;
}

latchkey::comm::ProcessGroups Groups(int world, int tp) {
  latchkey::comm::RendezvousConfig rdv;
  rdv.port = std::atoi(std::getenv("MASTER_PORT"));
  rdv.rank = std::atoi(std::getenv("RANK"));
  rdv.world_size = world;
  rdv.tp = tp;
  auto groups = latchkey::comm::CreateProcessGroups(latchkey::CommBackend::kAuto, rdv);
  if (!groups.ok()) {
    std::fprintf(stderr, "%s\n", std::string(groups.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(groups);
}

int ModesPhase(const Args& a, bool print) {
  latchkey::comm::ProcessGroups g = Groups(a.tp, a.tp);
  std::vector<Slot> full, one;
  for (const Mode& m : kModes) {
    latchkey::JobSpec spec = BaseSpec(a, a.layers, a.seq, a.tp, a.tp, 1);
    spec.activation_checkpointing.mode = m.recompute;
    spec.sequence_parallel = m.sp;
    full.push_back(Make(spec, &g));
    spec.model.n_layer = 1;
    one.push_back(Make(spec, &g));
  }
  const size_t n = full.size();
  std::vector<std::vector<double>> secs(n), ratios(n);
  std::vector<int64_t> act_full(n), act_one(n), peak(n);
  for (int round = 0; round <= a.reps; ++round) {
    std::vector<double> t(n, 0.0);
    for (size_t k = 0; k < n; ++k) {
      if (!full[k].engine) continue;
      const latchkey::StepReport r = Run(full[k]);
      t[k] = r.step_seconds;
      act_full[k] = r.activation_memory_bytes;
      peak[k] = r.peak_memory_bytes;
      if (round == 0 && one[k].engine) act_one[k] = Run(one[k]).activation_memory_bytes;
    }
    if (round == 0) continue;  // warm-up
    for (size_t k = 0; k < n; ++k) {
      if (!full[k].engine) continue;
      secs[k].push_back(t[k]);
      if (full[0].engine) ratios[k].push_back(t[k] / t[0]);
    }
  }
  if (!print) return 0;
  latchkey::memory::FormulaShape f;
  f.s = a.seq;
  f.b = a.mb;
  f.h = a.embd;
  f.a = a.heads;
  f.t = a.tp;
  f.activation_bytes = 4;  // fp32
  f.mask_bytes = 1;        // bool keep masks (worker/model/dropout_mask.h)
  f.dropout = a.dropout > 0;
  const double none_formula =
      ActivationBytesPerLayer(f, latchkey::memory::FormulaMode::kNone, false);
  const double none_measured =
      a.layers > 1 ? static_cast<double>(act_full[0] - act_one[0]) / (a.layers - 1) : 0.0;
  std::printf(
      "Memory per mode: %d layers, n_embd %d, %d heads (MQA), seq %d, micro-batch %d, TP %d, "
      "fp32, dropout %g, %d measured rounds (modes alternated)\n"
      "activation bytes per layer measured = (activation_memory_bytes(%d layers) - "
      "activation_memory_bytes(1 layer)) / %d; formula: Korthikanti et al. in fp32 (4-byte "
      "activations), 1-byte bool masks%s\n\n",
      a.layers, a.embd, a.heads, a.seq, a.mb, a.tp, a.dropout, a.reps, a.layers, a.layers - 1,
      f.dropout ? "" : " (dropout 0: no masks are stored)");
  std::printf(
      "| recompute | SP | act MiB/layer measured | formula | measured/formula | vs none no-SP "
      "measured | formula | peak MiB | step s median (min-max) | vs none no-SP per round |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const latchkey::memory::FormulaMode fm[] = {latchkey::memory::FormulaMode::kNone,
                                              latchkey::memory::FormulaMode::kSelective,
                                              latchkey::memory::FormulaMode::kFull};
  for (size_t k = 0; k < n; ++k) {
    const Mode& m = kModes[k];
    const double formula = ActivationBytesPerLayer(f, fm[static_cast<int>(m.recompute)], m.sp);
    const char* name = latchkey::RecomputeModeName(m.recompute);
    if (!full[k].engine) {
      std::printf("| %s | %s | not available in this build | %s | - | - | %.3f | - | - | - |\n",
                  name, m.sp ? "on" : "off", MiB(formula).c_str(), formula / none_formula);
      continue;
    }
    const double measured = static_cast<double>(act_full[k] - act_one[k]) / (a.layers - 1);
    std::printf(
        "| %s | %s | %s | %s | %.3f | %s | %.3f | %s | %.3f (%.3f-%.3f) | %s |\n", name,
        m.sp ? "on" : "off", MiB(measured).c_str(), MiB(formula).c_str(), measured / formula,
        full[0].engine ? std::to_string(measured / none_measured).substr(0, 5).c_str() : "-",
        formula / none_formula, MiB(static_cast<double>(peak[k])).c_str(), Median(secs[k]),
        Min(secs[k]), Max(secs[k]),
        ratios[k].empty() ? "-"
                          : (std::to_string(Median(ratios[k])).substr(0, 5) + " (" +
                             std::to_string(Min(ratios[k])).substr(0, 5) + "-" +
                             std::to_string(Max(ratios[k])).substr(0, 5) + ")")
                                .c_str());
  }
  std::fflush(stdout);
  return 0;
}

int ZeroPhase(const Args& a, bool print) {
  const int world = 2 * a.zero_tp;
  latchkey::comm::ProcessGroups g = Groups(world, a.zero_tp);
  struct Row {
    int stage;
    Slot slot;
    int64_t peak = 0, grad = 0;
  };
  std::vector<Row> rows;
  for (int stage : {1, 2}) {
    latchkey::JobSpec spec = BaseSpec(a, a.layers, a.zero_seq, a.zero_tp, world, a.zero_gas);
    spec.zero_stage = stage;
    spec.no_sync.assign(a.zero_gas, false);  // every micro-batch synchronised
    rows.push_back({stage, Make(spec, &g)});
  }
  for (int round = 0; round <= a.reps; ++round) {
    for (Row& r : rows) {
      if (!r.slot.engine) continue;
      const latchkey::StepReport rep = Run(r.slot);
      if (round == 0) continue;
      const int64_t params = r.slot.engine->state().params->numel() * 4;  // fp32 parameters
      r.peak = std::max(r.peak, rep.peak_memory_bytes);
      r.grad = std::max(r.grad, rep.peak_memory_bytes - params - rep.optimizer_state_bytes -
                                    rep.activation_memory_bytes);
    }
  }
  if (!print) return 0;
  std::printf(
      "\nZeRO: %d layers, n_embd %d, seq %d, DP 2 x TP %d, micro-batch %d, %d micro-batches per "
      "window, every one synchronised (latchkey.no_sync all false), SGD\n"
      "gradient-related peak = peak_memory_bytes - parameter bytes - optimizer state bytes - "
      "activation_memory_bytes (largest over %d measured windows)\n\n",
      a.layers, a.embd, a.zero_seq, a.zero_tp, a.mb, a.zero_gas, a.reps);
  std::printf(
      "| ZeRO stage | peak MiB | gradient-related peak MiB | vs ZeRO 1 |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (!r.slot.engine) {
      std::printf("| %d | not available in this build | - | - |\n", r.stage);
      continue;
    }
    std::printf("| %d | %s | %s | %.3f |\n", r.stage, MiB(r.peak).c_str(), MiB(r.grad).c_str(),
                rows[0].slot.engine ? static_cast<double>(r.grad) / rows[0].grad : 0.0);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--no-zero") {
      a.zero = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    int* ints[] = {&a.layers, &a.embd, &a.heads,   &a.seq,      &a.mb,
                   &a.tp,     &a.reps, &a.zero_tp, &a.zero_seq, &a.zero_gas};
    const char* names[] = {"--layers", "--embd", "--heads",   "--seq",      "--mb",
                           "--tp",     "--reps", "--zero-tp", "--zero-seq", "--zero-gas"};
    bool known = false;
    for (size_t j = 0; j < sizeof(ints) / sizeof(ints[0]); ++j) {
      if (k == names[j]) {
        *ints[j] = std::atoi(v.c_str());
        known = true;
      }
    }
    if (k == "--dropout") {
      a.dropout = std::atof(v.c_str());
      known = true;
    } else if (k == "--phase") {
      a.phase = v;
      known = true;
    }
    if (!known) {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (a.layers < 2) {
    std::fprintf(stderr, "--layers must be at least 2 (the per-layer bytes are differenced)\n");
    return 2;
  }
  if (std::getenv("RANK") == nullptr) {
    std::vector<std::string> args(argv, argv + argc);
    std::vector<std::string> modes = args, zero = args;
    modes.insert(modes.end(), {"--phase", "modes"});
    zero.insert(zero.end(), {"--phase", "zero"});
    auto Launch = [](std::vector<std::string>& v, int world) {
      std::vector<char*> p;
      for (std::string& s : v) p.push_back(s.data());
      return latchkey::bench::RunSelfAsRanks(static_cast<int>(p.size()), p.data(), world);
    };
    if (int rc = Launch(modes, a.tp); rc != 0) return rc;
    return a.zero ? Launch(zero, 2 * a.zero_tp) : 0;
  }
  const bool print = std::atoi(std::getenv("RANK")) == 0;
  latchkey::ConfigureComputeThreads(a.phase == "zero" ? 2 * a.zero_tp : a.tp);
  return a.phase == "zero" ? ZeroPhase(a, print) : ModesPhase(a, print);
}
