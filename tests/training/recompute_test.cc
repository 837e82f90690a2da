// Activation recomputation changes what the backward keeps, not what it computes.
//
// Gradient identity: real worker processes train the fixture's MQA model (dropout 0.1 at every
// site, GAS 2) with latchkey.activation_checkpointing selective, full and full with every_layers
// 2, and every gradient of the step-1 dump (--dump-grads, every rank) and every JSONL loss and
// gradient norm is bit for bit the run's with mode none, at TP 1, 2 and 4 in every K/V mode.
// Collectives: the JSONL collective_calls equal mode none's except all_reduce/tp under full,
// which carries 2 more per layer per micro-batch (each recomputed layer's forward re-issues its
// two row-parallel all-reduces); kv_allreduce_calls and every DP count are unchanged.
// bf16: the same runs in bf16 agree with mode none within 2^-11 (losses) and 2^-6 (gradients),
// bounds a run with other dropout masks falls outside. Evaluation (no grad) is unchanged. In
// process, over a TP group with no peers: the all-reduce count of one
// forward and backward per mode, and a collective failing inside the replay keeps its type.
// Memory: in process, a counting CPU allocator measures the bytes a training forward leaves
// allocated for its backward; selective leaves less than none, full less than selective, by at
// least what each mode is documented to drop (docs/memory.md); the MHA variant's gradients are
// mode none's too.
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/scripted_group.h"
#include "tests/support/specs.h"
#include "tests/support/tiny_model.h"
#include "worker/comm/collective_error.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"
#include "worker/model/tp_layout.h"

namespace latchkey::testing {
namespace {

constexpr int kDumpStep = 1;
constexpr int kSteps = 2;
constexpr int kGas = 2;
constexpr int kLayers = 2;  // the fixture model's

struct Mode {
  const char* name;  // for messages
  const char* mode;  // latchkey.activation_checkpointing.mode
  int every_layers;
};
constexpr Mode kNone{"none", "none", 1};
constexpr Mode kModes[] = {
    {"selective", "selective", 1}, {"full", "full", 1}, {"full_every_2", "full", 2}};

WorkerRun RunMode(const Mode& m, int tp, const std::string& kv, bool bf16,
                  const nlohmann::json& eval = nullptr, int dp = 1, int zero = 0,
                  bool sequence_parallel = false, int seed = 1) {
  RunShape s;
  s.eval = eval;
  s.dp = dp;
  s.zero = zero;
  if (dp > 1) s.mb = 1;
  s.variant = "mqa";
  s.tp = tp;
  s.gas = kGas;
  s.steps = kSteps;
  s.kv_reduce = kv;
  nlohmann::json spec = FixtureSpec(s);
  for (const char* site : {"resid_pdrop", "attn_pdrop", "embd_pdrop"}) spec["model"][site] = 0.1;
  spec["latchkey"]["activation_checkpointing"] = {{"mode", m.mode}};
  if (m.every_layers != 1) {
    spec["latchkey"]["activation_checkpointing"]["every_layers"] = m.every_layers;
  }
  if (bf16) spec["bf16"] = {{"enabled", true}};
  spec["latchkey"]["seed"] = seed;  // the dropout masks' key (the weights come from the fixture)
  if (sequence_parallel) spec["tensor_parallel"]["sequence_parallel"] = true;
  return RunWorkers(
      spec, dp * tp,
      {"--dump-grads", "{dir}/grads", "--dump-grads-step", std::to_string(kDumpStep)});
}

absl::StatusOr<StFile> Grads(const WorkerRun& run, int rank) {
  return ReadSafetensorsFile(run.dir + "/grads/grads-rank" + std::to_string(rank) + ".safetensors");
}

// Every gradient tensor of every rank byte for byte; "" when all are identical.
std::string GradDifferences(const WorkerRun& ref, const WorkerRun& run, int ranks) {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    auto a = Grads(ref, r);
    auto b = Grads(run, r);
    if (!a.ok() || !b.ok()) return "rank " + std::to_string(r) + ": unreadable gradient dump";
    if (a->tensors.size() != b->tensors.size()) return "tensor counts differ";
    if (a->tensors.empty()) return "empty gradient dump";
    for (const StTensor& t : a->tensors) {
      const StTensor* u = b->Find(t.name);
      if (u == nullptr) {
        out += "rank " + std::to_string(r) + " lacks " + t.name + "; ";
      } else if (u->data != t.data || u->shape != t.shape) {
        out += "rank " + std::to_string(r) + " " + t.name + "; ";
      }
    }
  }
  return out;
}

// The largest |a - b| over every gradient element of every rank, relative to the tensor's
// largest |a| (bf16 comparisons).
double MaxRelativeGradDiff(const WorkerRun& ref, const WorkerRun& run, int ranks) {
  double worst = 0.0;
  for (int r = 0; r < ranks; ++r) {
    auto a = Grads(ref, r);
    auto b = Grads(run, r);
    if (!a.ok() || !b.ok()) return INFINITY;
    for (const StTensor& t : a->tensors) {
      const StTensor* u = b->Find(t.name);
      if (u == nullptr) return INFINITY;
      const std::vector<double> x = TensorValues(t), y = TensorValues(*u);
      double scale = 1e-12, diff = 0.0;
      for (size_t i = 0; i < x.size(); ++i) {
        scale = std::max(scale, std::abs(x[i]));
        diff = std::max(diff, std::abs(x[i] - y[i]));
      }
      worst = std::max(worst, diff / scale);
    }
  }
  return worst;
}

struct Case {
  int tp;
  std::string kv;
  int dp = 1;
  int zero = 0;     // zero_optimization.stage
  bool sp = false;  // tensor_parallel.sequence_parallel
  int world() const { return dp * tp; }
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "tp " << c.tp << " " << c.kv << " dp " << c.dp << " zero " << c.zero
      << (c.sp ? " sequence parallel" : "");
}

class RecomputeIdentity : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeIdentity, GradientsLossesAndCountsEqualModeNone) {
  const Case& c = GetParam();
  const WorkerRun ref = RunMode(kNone, c.tp, c.kv, false, nullptr, c.dp, c.zero, c.sp);
  ASSERT_TRUE(ref.ok()) << ref.Describe();
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    const WorkerRun run = RunMode(m, c.tp, c.kv, false, nullptr, c.dp, c.zero, c.sp);
    ASSERT_TRUE(run.ok()) << run.Describe();
    EXPECT_EQ(GradDifferences(ref, run, c.world()), "") << ref.dir << " vs " << run.dir;
    const bool full = std::string(m.mode) == "full";
    for (int r = 0; r < c.world(); ++r) {
      ASSERT_EQ(run.steps[r].size(), static_cast<size_t>(kSteps));
      for (int s = 0; s < kSteps; ++s) {
        const nlohmann::json& want = ref.steps[r][s];
        const nlohmann::json& got = run.steps[r][s];
        // Bit for bit: the JSONL doubles round-trip exactly.
        EXPECT_EQ(got["loss"].get<double>(), want["loss"].get<double>()) << "rank " << r;
        EXPECT_EQ(got["grad_norm"].get<double>(), want["grad_norm"].get<double>()) << "rank " << r;
        EXPECT_EQ(got["kv_allreduce_calls"], want["kv_allreduce_calls"]) << "rank " << r;
        nlohmann::json calls = want["collective_calls"];
        if (full && c.tp > 1 && !c.sp) {
          // Each recomputed layer's forward re-issues its 2 all-reduces per micro-batch.
          calls["all_reduce/tp"] = calls["all_reduce/tp"].get<int64_t>() + 2 * kLayers * kGas;
        }
        if (full && c.sp) {
          // Under sequence parallelism those are its 2 all-gathers and 2 reduce-scatters.
          for (const char* op : {"all_gather/tp", "reduce_scatter/tp"}) {
            calls[op] = calls[op].get<int64_t>() + 2 * kLayers * kGas;
          }
        }
        EXPECT_EQ(got["collective_calls"], calls) << "rank " << r << " step " << s;
        EXPECT_EQ(got["replicated_allreduce_calls"], want["replicated_allreduce_calls"])
            << "rank " << r;
        if (c.tp > 1 && c.dp == 1 && !c.sp) {
          // The documented totals (docs/memory.md): (4 or 6)·L·n all_reduce/tp by the model,
          // the K/V reductions and the norm's one.
          const int64_t per_layer = full ? 6 : 4;
          EXPECT_EQ(got["collective_calls"]["all_reduce/tp"].get<int64_t>(),
                    per_layer * kLayers * kGas + got["kv_allreduce_calls"].get<int64_t>() + 1)
              << got["collective_calls"].dump();
        }
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& i) {
  std::string name = "tp" + std::to_string(i.param.tp) + "_" + i.param.kv;
  if (i.param.sp) name += "_sp";
  if (i.param.dp > 1)
    name += "_dp" + std::to_string(i.param.dp) + "_zero" + std::to_string(i.param.zero);
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeIdentity,
    ::testing::Values(Case{1, "per_micro_batch"}, Case{1, "deferred"}, Case{1, "coalesced"},
                      Case{2, "per_micro_batch"}, Case{2, "deferred"}, Case{2, "coalesced"},
                      Case{4, "per_micro_batch"}, Case{4, "deferred"}, Case{4, "coalesced"},
                      // DP 2: the DP collectives (ZeRO-0's mean
                      // all-reduces, ZeRO-1's reduce-scatter and
                      // all-gathers) are unchanged too.
                      Case{2, "coalesced", 2, 0}, Case{2, "deferred", 2, 1},
                      // With sequence parallelism (its own collectives).
                      Case{2, "deferred", 1, 0, true}, Case{4, "coalesced", 1, 0, true},
                      Case{2, "per_micro_batch", 2, 1, true}),
    CaseName);

// The largest relative loss difference between two runs, over every rank and step.
double MaxRelativeLossDiff(const WorkerRun& ref, const WorkerRun& run, int ranks) {
  double worst = 0.0;
  for (int r = 0; r < ranks; ++r) {
    for (int s = 0; s < kSteps; ++s) {
      const double a = ref.steps[r][s]["loss"].get<double>();
      const double b = run.steps[r][s]["loss"].get<double>();
      worst = std::max(worst, std::abs(a - b) / std::abs(a));
    }
  }
  return worst;
}

// bf16 runs the same code on bf16 compute parameters: the modes agree with none within 2^-11
// relative on losses and 2^-6 on gradients (measured: 0, the same operations in the same order);
// the measured differences are printed. Negative control: the bug a replay is most likely to have
// is recomputing with other dropout masks than the forward drew; mode none with another seed
// (other masks everywhere) is that error, and it must fall outside both bounds. It moves the
// losses by 2.4e-3 relative over the two steps, inside bf16's 2^-8 (3.9e-3), so the loss bound
// is 2^-11 (4.9e-4, the control 5 times over it); the gradients move by 2.5 (160 times 2^-6).
TEST(RecomputeBf16, AgreesWithModeNoneWithinBf16Tolerance) {
  const int tp = 2;
  constexpr double kLossTol = 1.0 / 2048, kGradTol = 1.0 / 64;
  const WorkerRun ref = RunMode(kNone, tp, "coalesced", true);
  ASSERT_TRUE(ref.ok()) << ref.Describe();
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    const WorkerRun run = RunMode(m, tp, "coalesced", true);
    ASSERT_TRUE(run.ok()) << run.Describe();
    const double loss_diff = MaxRelativeLossDiff(ref, run, tp);
    const double grad_diff = MaxRelativeGradDiff(ref, run, tp);
    std::printf("bf16 %s vs none: max relative loss diff %.3g, max relative gradient diff %.3g\n",
                m.name, loss_diff, grad_diff);
    EXPECT_LE(loss_diff, kLossTol);
    EXPECT_LE(grad_diff, kGradTol);
  }
  const WorkerRun other_masks =
      RunMode(kNone, tp, "coalesced", true, nullptr, 1, 0, false, /*seed=*/2);
  ASSERT_TRUE(other_masks.ok()) << other_masks.Describe();
  const double loss_control = MaxRelativeLossDiff(ref, other_masks, tp);
  const double grad_control = MaxRelativeGradDiff(ref, other_masks, tp);
  std::printf(
      "bf16 none with other dropout masks vs none: loss %.3g (bound %.3g), gradient %.3g "
      "(bound %.3g)\n",
      loss_control, kLossTol, grad_control, kGradTol);
  EXPECT_GT(loss_control, kLossTol) << "other dropout masks would pass the loss bound";
  EXPECT_GT(grad_control, kGradTol) << "other dropout masks would pass the gradient bound";
}

// Evaluation (no grad) runs the model as always under every mode: the eval losses after each
// update are mode none's, bit for bit.
TEST(RecomputeEval, EvalLossesEqualModeNone) {
  const nlohmann::json eval = {{"tokens_file", FixtureDir() + "/eval.bin"},
                               {"dtype", "uint16"},
                               {"every_steps", 1},
                               {"samples", 4}};
  const WorkerRun ref = RunMode(kNone, 2, "coalesced", false, eval);
  ASSERT_TRUE(ref.ok()) << ref.Describe();
  for (const Mode& m : {kModes[0], kModes[1]}) {
    SCOPED_TRACE(m.name);
    const WorkerRun run = RunMode(m, 2, "coalesced", false, eval);
    ASSERT_TRUE(run.ok()) << run.Describe();
    for (int r = 0; r < 2; ++r) {
      for (int s = 0; s < kSteps; ++s) {
        ASSERT_TRUE(run.steps[r][s].contains("eval_loss")) << run.steps[r][s].dump();
        EXPECT_EQ(run.steps[r][s]["eval_loss"].get<double>(),
                  ref.steps[r][s]["eval_loss"].get<double>())
            << "rank " << r << " step " << s;
      }
    }
  }
}

// --- In process: the replay's collectives -------------------------------------------------

// Rank 0 of a TP-2 tiny model over a group with no peers: counts its all-reduces, and fails
// every one after the first `ok_all_reduces`.
struct TpShard {
  TpShard(const Mode& m, int ok_all_reduces)
      : group("tp", 0, 2, std::make_shared<comm::CollectiveStats>(), ok_all_reduces),
        config(TinyModel()),
        store(*BuildTpLayout(config, 2, 0), 1) {
    EXPECT_TRUE(store.LoadFromFull(InitFullWeights(config, 3), 0).ok());
    model = std::make_unique<GptBigCode>(config, &store, &group, 1);
    ActivationCheckpointingConfig ac;
    ac.mode = *ParseRecomputeMode(m.mode);
    ac.every_layers = m.every_layers;
    model->set_activation_checkpointing(ac);
  }
  at::Tensor Loss() {
    at::Tensor ids = at::arange(16, at::kLong).remainder(config.vocab_size).view({2, 8});
    return model->Loss(ids, ids, {0, 1});
  }
  testing::ScriptedGroup group;
  ModelConfig config;
  ParamStore store;
  std::unique_ptr<GptBigCode> model;
};

TEST(RecomputeCollectives, FullReplaysEachLayersTwoForwardAllReducesInBackward) {
  for (const Mode& m : {kNone, kModes[0], kModes[1], kModes[2]}) {
    SCOPED_TRACE(m.name);
    TpShard shard(m, std::numeric_limits<int>::max());
    at::Tensor loss = shard.Loss();
    EXPECT_EQ(shard.group.all_reduces(), 2 * kLayers);  // the forward, in every mode
    loss.backward();
    const int per_layer = std::string(m.mode) == "full" ? 6 : 4;
    EXPECT_EQ(shard.group.all_reduces(), per_layer * kLayers);
  }
}

// A collective failing in the replay (inside the checkpoint node's backward, a reentrant
// backward) reaches the caller of backward() as the same CollectiveError.
TEST(RecomputeCollectives, CollectiveFailingInTheReplayKeepsItsTypeThroughAutograd) {
  TpShard shard(kModes[1], /*ok_all_reduces=*/2 * kLayers);  // the whole forward
  at::Tensor loss = shard.Loss();
  try {
    loss.backward();
    FAIL() << "backward succeeded";
  } catch (const comm::CollectiveError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded) << e.status();
    EXPECT_NE(e.status().message().find("all_reduce on group 'tp'"), std::string::npos)
        << e.status();
  } catch (const std::exception& e) {
    FAIL() << "the collective's error lost its type: " << e.what();
  }
  // The first backward collective is the last layer's replayed attn.c_proj all-reduce.
  EXPECT_EQ(shard.group.all_reduces(), 2 * kLayers + 1);
}

// --- Memory --------------------------------------------------------------------------------

// From 2.3 on, c10::Allocator::allocate is non-const and copy_data is pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define LATCHKEY_TEST_ALLOCATE_CONST
#define LATCHKEY_TEST_ALLOCATOR_COPY_DATA 1
#else
#define LATCHKEY_TEST_ALLOCATE_CONST const
#define LATCHKEY_TEST_ALLOCATOR_COPY_DATA 0
#endif

// libtorch's CPU allocations, counted: live bytes now (the default allocator underneath).
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) LATCHKEY_TEST_ALLOCATE_CONST override {
    void* p = n == 0 ? nullptr : c10::alloc_cpu(n);
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(mu());
      sizes()[p] = n;
      live() += static_cast<int64_t>(n);
    }
    return {p, p, &Free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
#if LATCHKEY_TEST_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  static int64_t Live() {
    std::lock_guard<std::mutex> lock(mu());
    return live();
  }

 private:
  static void Free(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = sizes().find(p);
      if (it != sizes().end()) {
        live() -= static_cast<int64_t>(it->second);
        sizes().erase(it);
      }
    }
    c10::free_cpu(p);
  }
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<void*, size_t>& sizes() {
    static auto* s = new std::map<void*, size_t>();
    return *s;
  }
  static int64_t& live() {
    static int64_t n = 0;
    return n;
  }
};

// Bytes left allocated by one training forward (through the loss) under `m`, i.e. what the
// backward will consume; the backward is run too, and must leave the same gradients.
struct Held {
  int64_t bytes = 0;
  at::Tensor grads;
};

Held ForwardHeld(const ModelConfig& cfg, const Mode& m, int B, int S) {
  auto layout = BuildTpLayout(cfg, 1, 0);
  EXPECT_TRUE(layout.ok()) << layout.status();
  ParamStore store(*std::move(layout), 1);
  EXPECT_TRUE(store.LoadFromFull(InitFullWeights(cfg, 3), 0).ok());
  GptBigCode model(cfg, &store, nullptr, /*dropout_seed=*/5);
  ActivationCheckpointingConfig ac;
  ac.mode = *ParseRecomputeMode(m.mode);
  ac.every_layers = m.every_layers;
  model.set_activation_checkpointing(ac);
  at::Tensor ids = at::randint(cfg.vocab_size, {B, S + 1}, at::TensorOptions().dtype(at::kLong));
  at::Tensor in = ids.narrow(1, 0, S).contiguous(), labels = ids.narrow(1, 1, S).contiguous();
  std::vector<int64_t> rows(B);
  for (int b = 0; b < B; ++b) rows[b] = b;
  store.ZeroGrads();
  Held h;
  const int64_t before = CountingCpuAllocator::Live();
  at::Tensor loss = model.Loss(in, labels, rows);
  h.bytes = CountingCpuAllocator::Live() - before;
  loss.backward();
  h.grads = store.flat_grads().clone();
  return h;
}

TEST(RecomputeMemory, SelectiveHoldsLessThanNoneAndFullLessThanSelective) {
  static CountingCpuAllocator counting;
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  // Attention-heavy enough that core attention's [B, H, S, S] tensors dominate a layer.
  ModelConfig cfg = SmallModel(/*n_layer=*/4, /*n_embd=*/64, /*n_head=*/8, /*n_positions=*/128);
  cfg.attn_pdrop = cfg.resid_pdrop = cfg.embd_pdrop = 0.1;
  const int B = 2, S = 128;
  at::manual_seed(11);
  const Held none = ForwardHeld(cfg, kNone, B, S);
  at::manual_seed(11);
  const Held selective = ForwardHeld(cfg, kModes[0], B, S);
  at::manual_seed(11);
  const Held full = ForwardHeld(cfg, kModes[1], B, S);
  at::manual_seed(11);
  const Held full2 = ForwardHeld(cfg, kModes[2], B, S);
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), /*priority=*/100);
  std::printf(
      "activation bytes held after the forward: none %lld, selective %lld, full %lld, "
      "full every_layers 2 %lld\n",
      static_cast<long long>(none.bytes), static_cast<long long>(selective.bytes),
      static_cast<long long>(full.bytes), static_cast<long long>(full2.bytes));
  // Selective drops, per layer, the fp32 softmax output and dropped probabilities and the 1-byte
  // keep mask of core attention: 9·B·H·S² bytes.
  const int64_t L = cfg.n_layer, H = cfg.n_head, E = cfg.n_embd;
  EXPECT_GE(none.bytes - selective.bytes, L * 9 * B * H * S * S) << none.bytes;
  // Full keeps one fp32 [B, S, E] input per layer group and nothing inside the layers: every
  // layer of none holds far more than that (its attention matrices alone, above).
  EXPECT_LT(full.bytes, selective.bytes);
  EXPECT_LE(full2.bytes, full.bytes - (L / 2) * B * S * E * 4);
  // The same gradients, bit for bit (fp32, dropout 0.1, in process).
  EXPECT_TRUE(at::equal(none.grads, selective.grads));
  EXPECT_TRUE(at::equal(none.grads, full.grads));
  EXPECT_TRUE(at::equal(none.grads, full2.grads));
}

// MHA (q, k, v as narrow views of one [B, Hl, S, 3D] block) in process: the same gradients.
TEST(RecomputeMemory, MhaGradientsEqualModeNone) {
  static CountingCpuAllocator counting;
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  ModelConfig cfg = TinyMhaModel();
  cfg.attn_pdrop = cfg.resid_pdrop = cfg.embd_pdrop = 0.1;
  at::manual_seed(12);
  const Held none = ForwardHeld(cfg, kNone, 2, 32);
  for (const Mode& m : kModes) {
    at::manual_seed(12);
    const Held h = ForwardHeld(cfg, m, 2, 32);
    EXPECT_TRUE(at::equal(none.grads, h.grads)) << m.name;
    EXPECT_LT(h.bytes, none.bytes) << m.name;
  }
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), /*priority=*/100);
}

}  // namespace
}  // namespace latchkey::testing
