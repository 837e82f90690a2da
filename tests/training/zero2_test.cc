// ZeRO-2 (gradients reduce-scattered during the backward into the DP partition) against ZeRO-1
// on DP 2 x TP 2: the same losses, grad norms and final weights within 1e-6 in every K/V mode,
// the B1-style K/V collective counts, clipping and bf16, the bucket issue times against the
// backward's end, the peak gradient bytes, resume bit-exact, ZeRO-1 checkpoints resumed under
// ZeRO-2 (and back), the gradient dump; and ZeRO-1's optionally overlapped boundary reduction
// against the plain one (bitwise). Parity runs are real worker processes; memory and resume run the
// engine's ranks as threads (tests/support/rank_threads.h).
//
// Where it is bitwise (shm, the tests' backend): the DP sums of ZeRO-1's whole-buffer
// reduce-scatter and of ZeRO-2's bucket reduce-scatters are the same rank-order sums per
// element, so with the default no_sync mask (one synchronised micro-batch per window) and the K/V
// sum where ZeRO-1 has it (per_micro_batch) the runs agree bit for bit. Deferred and coalesced
// sum K/V over DP then TP on the partition ((a+c)+(b+d) instead of (a+b)+(c+d)), and several
// synchronised micro-batches add their DP sums into the partition instead of averaging the
// accumulated buffer, which round differently: within 1e-6 there. AdamW is compared only where
// the runs are bitwise (and in bf16): its update m / sqrt(v) turns a last-bit difference of a
// gradient element near zero into a difference of order lr in the weight (7.6e-5 after 4 steps
// at lr 0.01 on this fixture), which says nothing about ZeRO-2; SGD carries the clipping cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/latch.h"
#include "tests/support/launch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

constexpr int kLayers = 2;  // the fixture model

// Largest relative difference of a per-step field over every rank and step.
double MaxRelDiff(const WorkerRun& a, const WorkerRun& b, const char* field) {
  double d = 0.0;
  if (a.steps.size() != b.steps.size()) return INFINITY;
  for (size_t r = 0; r < a.steps.size(); ++r) {
    if (a.steps[r].size() != b.steps[r].size()) return INFINITY;
    for (size_t s = 0; s < a.steps[r].size(); ++s) {
      const double x = a.steps[r][s][field].get<double>();
      const double y = b.steps[r][s][field].get<double>();
      d = std::max(d, std::abs(x - y) / std::max(std::abs(x), 1e-30));
    }
  }
  return d;
}

struct Case {
  std::string kv;
  bool all_sync = false;  // every micro-batch synchronised (no_sync all false)
  double clip = 0.0;
  bool bf16 = false;
  std::string optimizer = "SGD";
  bool bitwise = false;  // expected bit for bit on shm (see the file comment)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.kv << (c.all_sync ? " all-sync" : "") << (c.clip > 0 ? " clip" : "")
      << (c.bf16 ? " bf16" : "") << " " << c.optimizer;
}

WorkerRun RunCase(const Case& c, int zero) {
  RunShape s = Dp2Tp2Shape();
  s.gas = 4;
  s.steps = 4;
  s.lr = c.optimizer == "SGD" ? 0.1 : 0.01;
  s.optimizer = c.optimizer;
  s.clip = c.clip;
  s.zero = zero;
  s.kv_reduce = c.kv;
  nlohmann::json spec = FixtureSpec(s);
  if (c.all_sync) spec["latchkey"]["no_sync"] = {false, false, false, false};
  if (c.bf16) spec["bf16"] = {{"enabled", true}};
  return RunWorkers(spec, 4, {"--save", "{dir}/final"});
}

class Zero2Parity : public ::testing::TestWithParam<Case> {};

TEST_P(Zero2Parity, MatchesZero1WithTheKvCounts) {
  const Case& c = GetParam();
  WorkerRun one = RunCase(c, 1);
  ASSERT_TRUE(one.ok()) << one.Describe();
  WorkerRun two = RunCase(c, 2);
  ASSERT_TRUE(two.ok()) << two.Describe();
  const double loss = MaxRelDiff(one, two, "loss");
  const double norm = MaxRelDiff(one, two, "grad_norm");
  const double weights = MaxParamDiff(one, two);
  std::printf("zero2 vs zero1 [%s%s%s%s]: loss %.3g  grad_norm %.3g  weights %.3g\n", c.kv.c_str(),
              c.all_sync ? " all-sync" : "", c.clip > 0 ? " clip" : "", c.bf16 ? " bf16" : "", loss,
              norm, weights);
  EXPECT_LE(loss, 1e-6);
  EXPECT_LE(norm, 1e-6);
  EXPECT_LE(weights, 1e-6);
  if (c.bitwise) {
    EXPECT_EQ(loss, 0.0);
    EXPECT_EQ(norm, 0.0);
    EXPECT_EQ(weights, 0.0);
  }
  // B1's counts per step: 2 L n_s -> 2 L -> 1, on every rank, as under ZeRO-1.
  const int64_t want_kv = c.kv == "per_micro_batch" ? 2 * kLayers * 4 : c.kv == "deferred" ? 4 : 1;
  const int syncs = c.all_sync ? 4 : 1;
  for (size_t r = 0; r < two.steps.size(); ++r) {
    ASSERT_EQ(two.steps[r].size(), 4u);
    for (size_t s = 0; s < two.steps[r].size(); ++s) {
      const auto& step = two.steps[r][s];
      EXPECT_EQ(step["kv_allreduce_calls"].get<int64_t>(), want_kv) << "rank " << r;
      EXPECT_EQ(step["kv_allreduce_calls"], one.steps[r][s]["kv_allreduce_calls"]);
      const auto& calls = step["collective_calls"];
      // The buckets (the same number every synchronised micro-batch) and one all-gather.
      const int64_t rs = calls["reduce_scatter/dp"].get<int64_t>();
      EXPECT_EQ(rs % syncs, 0) << calls.dump();
      EXPECT_GT(rs / syncs, 2) << calls.dump();
      EXPECT_EQ(calls["all_gather/dp"].get<int64_t>(), 1) << calls.dump();
      EXPECT_EQ(calls.count("all_reduce/dp"), 0u) << calls.dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zero2, Zero2Parity,
    ::testing::Values(Case{"per_micro_batch", false, 0.0, false, "SGD", true}, Case{"deferred"},
                      Case{"coalesced"}, Case{"per_micro_batch", true}, Case{"deferred", true},
                      Case{"coalesced", true}, Case{"coalesced", false, 0.05},
                      Case{"coalesced", true, 0.05},
                      Case{"per_micro_batch", false, 0.05, false, "AdamW", true},
                      Case{"per_micro_batch", false, 0.05, true, "AdamW", true},
                      Case{"coalesced", true, 0.05, true, "AdamW"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = i.param.kv + (i.param.all_sync ? "_allsync" : "") +
                      (i.param.clip > 0 ? "_clip" : "") + (i.param.bf16 ? "_bf16" : "") + "_" +
                      i.param.optimizer;
      return n;
    });

// --dump-grads under ZeRO-2 gathers the gradient partitions into the file ZeRO-1 writes: the same
// bytes in the bitwise case (per_micro_batch, default mask), on every rank.
TEST(Zero2GradDump, SameFilesAsZero1) {
  std::map<int, WorkerRun> runs;
  for (int zero : {1, 2}) {
    RunShape s = Dp2Tp2Shape();
    s.gas = 2;
    s.steps = 2;
    s.lr = 0.1;
    s.zero = zero;
    s.kv_reduce = "per_micro_batch";
    runs[zero] =
        RunWorkers(FixtureSpec(s), 4, {"--dump-grads", "{dir}/grads", "--dump-grads-step", "1"});
    ASSERT_TRUE(runs[zero].ok()) << runs[zero].Describe();
  }
  for (int r = 0; r < 4; ++r) {
    const std::string name = "/grads/grads-rank" + std::to_string(r) + ".safetensors";
    auto a = ReadSafetensorsFile(runs[1].dir + name);
    auto b = ReadSafetensorsFile(runs[2].dir + name);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->tensors.size(), b->tensors.size());
    for (size_t i = 0; i < a->tensors.size(); ++i) {
      EXPECT_EQ(a->tensors[i].name, b->tensors[i].name);
      EXPECT_EQ(a->tensors[i].data, b->tensors[i].data)
          << "rank " << r << " " << a->tensors[i].name;
    }
  }
}

// --- In-process: memory, bucket times, resume ------------------------------------------------

constexpr int kWorld = 4;
constexpr int kTp = 2;

JobSpec MakeSpec(int zero, bool bf16 = false, const std::string& kv = "auto") {
  const int world = kWorld, tp = kTp;
  SpecParams p;  // synthetic data, AdamW
  p.kv_reduce = kv;
  p.tp = tp;
  p.world_size = world;
  p.clip = 0.5;
  p.steps = 6;
  p.seed = 7;
  p.zero_stage = zero;
  p.model["resid_pdrop"] = 0.1;
  p.model["attn_pdrop"] = 0.1;
  p.model["embd_pdrop"] = 0.1;
  nlohmann::json spec = SpecObject(p);
  if (bf16) spec["bf16"] = {{"enabled", true}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(spec.dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

Latch LatchFor(const JobSpec& spec, int64_t window, bool all_sync = false) {
  LatchPolicy policy = InitialPolicy(spec);
  if (all_sync) policy.no_sync.assign(spec.WindowLength(window), false);
  Latch l = DecideLatch(spec, policy, window, spec.FirstMicroBatch(window));
  l.first_sample = l.first_micro_batch * (spec.world_size / spec.tp) * spec.micro_batch_size;
  return l;
}

class Zero2InProcess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(kWorld); }
};

// The gradient bytes a rank holds over a window, every micro-batch synchronised (the case ZeRO-2
// saves in) and with the default mask (where it holds what ZeRO-1 holds), and the buckets'
// issue times against the end of the last backward.
TEST_F(Zero2InProcess, PeakGradientBytesAndBucketTimes) {
  std::map<std::pair<int, bool>, int64_t> peak;  // (stage, all_sync) -> rank 0's peak
  std::mutex mu;
  for (int zero : {1, 2}) {
    const JobSpec spec = MakeSpec(zero);
    RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
      auto engine = CreateEngine(spec, &g);
      ASSERT_TRUE(engine.ok()) << engine.status();
      for (bool all_sync : {true, false}) {
        absl::StatusOr<StepReport> r =
            (*engine)->RunWindow(LatchFor(spec, all_sync ? 0 : 1, all_sync));
        ASSERT_TRUE(r.ok()) << r.status();
        std::lock_guard<std::mutex> lock(mu);
        if (g.rank == 0) peak[{zero, all_sync}] = (*engine)->peak_gradient_bytes();
        const BucketTrace t = (*engine)->last_bucket_trace();
        if (zero == 2) {
          ASSERT_GT(t.issued.size(), 3u);
          // All but the K/V bucket and the embeddings' (the backward's last gradients) go out
          // while the backward still runs.
          EXPECT_LT(t.issued[t.issued.size() / 2], t.backward_end) << "rank " << g.rank;
          EXPECT_LT(t.issued.front(), t.backward_end) << "rank " << g.rank;
          EXPECT_GE(t.issued.back(), t.backward_end) << "rank " << g.rank;  // the K/V bucket
        }
      }
    });
  }
  const double all_sync = static_cast<double>(peak[{2, true}]) / peak[{1, true}];
  const double masked = static_cast<double>(peak[{2, false}]) / peak[{1, false}];
  std::printf(
      "peak gradient bytes, DP 2 x TP 2, rank 0:\n"
      "  every micro-batch synchronised: ZeRO-1 %lld  ZeRO-2 %lld  ratio %.3f\n"
      "  default no_sync mask:           ZeRO-1 %lld  ZeRO-2 %lld  ratio %.3f\n",
      static_cast<long long>(peak[{1, true}]), static_cast<long long>(peak[{2, true}]), all_sync,
      static_cast<long long>(peak[{1, false}]), static_cast<long long>(peak[{2, false}]), masked);
  EXPECT_LE(all_sync, 0.55);
}

struct Reports {
  std::mutex mu;
  std::map<int, std::map<int64_t, StepReport>> by_rank;
  std::map<int, CheckpointCommit> commits;
};

void RunWindows(Engine& engine, const JobSpec& spec, int rank, int64_t from, int64_t to,
                Reports& out) {
  for (int64_t s = from; s < to; ++s) {
    absl::StatusOr<StepReport> r = engine.RunWindow(LatchFor(spec, s));
    ASSERT_TRUE(r.ok()) << "rank " << rank << " step " << s << ": " << r.status();
    std::lock_guard<std::mutex> lock(out.mu);
    out.by_rank[rank][s] = *r;
  }
}

void Save(Engine& engine, comm::ProcessGroups& g, const std::string& root, Reports& out) {
  TrainingCheckpointRequest req;
  req.root = root;
  absl::StatusOr<CheckpointCommit> c = SaveTrainingCheckpoint(engine.state(), req);
  ASSERT_TRUE(c.ok()) << "rank " << g.rank << ": " << c.status();
  std::lock_guard<std::mutex> lock(out.mu);
  out.commits[g.rank] = *c;
}

// Runs `to` windows of `spec`, resuming from `from_dir` (a committed step folder) when given,
// and writes the final HF weights to `hf`.
void RunSpan(const JobSpec& spec, int64_t from, int64_t to, const std::string& from_dir,
             const std::string& save_root, const std::string& hf, Reports& out,
             const EngineOptions& options = {}, std::vector<BucketTrace>* traces = nullptr) {
  std::mutex mu;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    if (!from_dir.empty()) {
      absl::Status st = LoadTrainingCheckpoint((*engine)->state(), from_dir, "standalone", "");
      ASSERT_TRUE(st.ok()) << st;
    }
    RunWindows(**engine, spec, g.rank, from, to, out);
    if (traces != nullptr) {
      std::lock_guard<std::mutex> lock(mu);
      traces->push_back((*engine)->last_bucket_trace());
    }
    if (!save_root.empty()) Save(**engine, g, save_root, out);
    if (!hf.empty()) {
      ASSERT_TRUE(SaveHfCheckpoint((*engine)->state(), hf).ok());
    }
  });
}

std::string Bytes(const std::string& path) {
  auto f = ReadSafetensorsFile(path);
  EXPECT_TRUE(f.ok()) << f.status();
  std::string all;
  if (f.ok()) {
    for (const StTensor& t : f->tensors) all += t.name + t.data;
  }
  return all;
}

// Save after step 2 under ZeRO-2, resume in new groups and a new engine: the same reports and
// byte-identical weights as the uninterrupted ZeRO-2 run (fp32 and bf16, dropout 0.1, clipping).
TEST_F(Zero2InProcess, ResumeIsBitExact) {
  for (bool bf16 : {false, true}) {
    const JobSpec spec = MakeSpec(2, bf16);
    const ScopedTempDir dir("zero2-resume");
    Reports straight, first, resumed;
    RunSpan(spec, 0, 6, "", "", dir / "straight.safetensors", straight);
    RunSpan(spec, 0, 3, "", dir / "ckpt", "", first);
    ASSERT_EQ(first.commits.size(), static_cast<size_t>(kWorld));
    RunSpan(spec, 3, 6, first.commits[0].dir, "", dir / "resumed.safetensors", resumed);
    for (int r = 0; r < kWorld; ++r) {
      for (int64_t s = 3; s < 6; ++s) {
        EXPECT_EQ(resumed.by_rank[r][s].loss, straight.by_rank[r][s].loss) << r << " " << s;
        EXPECT_EQ(resumed.by_rank[r][s].grad_norm, straight.by_rank[r][s].grad_norm);
      }
    }
    EXPECT_EQ(Bytes(dir / "resumed.safetensors/model.safetensors"),
              Bytes(dir / "straight.safetensors/model.safetensors"))
        << "bf16 " << bf16;
  }
}

// A ZeRO-1 checkpoint resumed under ZeRO-2 (and a ZeRO-2 one under ZeRO-1) continues as the
// uninterrupted ZeRO-1 run: stage 2's optimizer partition is stage 1's. With per_micro_batch K/V
// and the default mask the stages are bitwise equal (the file comment), so the crossed runs end
// with the same bytes; coalesced within 1e-6 of the losses (AdamW, dropout, clipping).
TEST_F(Zero2InProcess, CheckpointsCrossBetweenStages) {
  const JobSpec one = MakeSpec(1, false, "per_micro_batch");
  const JobSpec two = MakeSpec(2, false, "per_micro_batch");
  const ScopedTempDir dir("zero2-cross");
  Reports straight, a, b, c, d;
  RunSpan(one, 0, 6, "", "", dir / "straight", straight);
  RunSpan(one, 0, 3, "", dir / "z1", "", a);
  RunSpan(two, 3, 6, a.commits[0].dir, "", dir / "z1-then-z2", b);
  RunSpan(two, 0, 3, "", dir / "z2", "", c);
  RunSpan(one, 3, 6, c.commits[0].dir, "", dir / "z2-then-z1", d);
  for (int64_t s = 3; s < 6; ++s) {
    const double want = straight.by_rank[0][s].loss;
    EXPECT_LE(std::abs(b.by_rank[0][s].loss - want), 1e-6 * std::abs(want)) << s;
    EXPECT_LE(std::abs(d.by_rank[0][s].loss - want), 1e-6 * std::abs(want)) << s;
  }
  const std::string ref = dir / "straight/model.safetensors";
  EXPECT_EQ(Bytes(dir / "z1-then-z2/model.safetensors"), Bytes(ref));
  EXPECT_EQ(Bytes(dir / "z2-then-z1/model.safetensors"), Bytes(ref));
  // Coalesced: the K/V sums run in another order under ZeRO-2; the losses stay within 1e-6.
  const JobSpec one_c = MakeSpec(1);
  const JobSpec two_c = MakeSpec(2);
  Reports straight_c, e, f;
  RunSpan(one_c, 0, 6, "", "", dir / "straight-c", straight_c);
  RunSpan(one_c, 0, 3, "", dir / "z1c", "", e);
  RunSpan(two_c, 3, 6, e.commits[0].dir, "", dir / "z1c-then-z2", f);
  for (int64_t s = 3; s < 6; ++s) {
    const double want = straight_c.by_rank[0][s].loss;
    EXPECT_LE(std::abs(f.by_rank[0][s].loss - want), 1e-6 * std::abs(want)) << s;
  }
  EXPECT_LE(
      MaxWeightDiff(dir / "straight-c/model.safetensors", dir / "z1c-then-z2/model.safetensors"),
      1e-5);
}

// ZeRO-1 with the boundary reduce-scatter bucketed into the last backward
// (EngineOptions::overlap_dp_reduction): bitwise the same reports and weights as the
// whole-buffer reduce-scatter on shm, with the buckets issued before the backward ends.
TEST_F(Zero2InProcess, Zero1OverlappedReductionIsBitwiseAndIssuedDuringTheBackward) {
  for (const char* kv : {"per_micro_batch", "deferred", "coalesced"}) {
    for (bool bf16 : {false, true}) {
      const JobSpec spec = MakeSpec(1, bf16, kv);
      const ScopedTempDir dir("zero1-overlap");
      Reports plain, overlapped;
      EngineOptions on;
      on.overlap_dp_reduction = true;
      std::vector<BucketTrace> traces;
      RunSpan(spec, 0, 4, "", "", dir / "plain", plain);
      RunSpan(spec, 0, 4, "", "", dir / "overlapped", overlapped, on, &traces);
      const std::string where = std::string(kv) + (bf16 ? " bf16" : "");
      for (int r = 0; r < kWorld; ++r) {
        for (int64_t s = 0; s < 4; ++s) {
          const StepReport& a = plain.by_rank[r][s];
          const StepReport& b = overlapped.by_rank[r][s];
          EXPECT_EQ(a.loss, b.loss) << where;
          EXPECT_EQ(a.grad_norm, b.grad_norm) << where;
          EXPECT_EQ(a.kv_allreduce_calls, b.kv_allreduce_calls) << where;
          EXPECT_EQ(a.collective_calls.at("reduce_scatter/dp"), 1) << where;
          EXPECT_GT(b.collective_calls.at("reduce_scatter/dp"), 3) << where;
        }
      }
      EXPECT_EQ(Bytes(dir / "plain/model.safetensors"), Bytes(dir / "overlapped/model.safetensors"))
          << where;
      ASSERT_EQ(traces.size(), static_cast<size_t>(kWorld));
      for (const BucketTrace& t : traces) {
        ASSERT_GT(t.issued.size(), 3u) << where;
        EXPECT_LT(t.issued[t.issued.size() / 2], t.backward_end) << where;
        EXPECT_GE(t.issued.back(), t.backward_end) << where;  // the K/V bucket, after its sum
        if (bf16 || std::string(kv) != "coalesced") continue;
        std::printf(
            "zero1 overlapped (%s): %zu buckets, %zu issued before the backward ended, "
            "first %.3f ms before it\n",
            kv, t.issued.size(),
            static_cast<size_t>(std::count_if(t.issued.begin(), t.issued.end(),
                                              [&](const auto& x) { return x < t.backward_end; })),
            std::chrono::duration<double, std::milli>(t.backward_end - t.issued.front()).count());
      }
    }
  }
}

}  // namespace
}  // namespace latchkey::testing
