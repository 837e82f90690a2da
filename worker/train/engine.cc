#include "worker/train/engine.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/checkpoint/training_state.h"
#include "worker/data/sample_dump.h"
#include "worker/data/token_source.h"
#include "worker/memory/memory.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"
#include "worker/train/evaluator.h"
#include "worker/train/flat_ops.h"
#include "worker/train/grad_norm.h"
#include "worker/train/grad_sync.h"
#include "worker/train/kv_reducer.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/optimizer.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds spent inside collectives so far: every op, group and tag (`all`), and those of the
// data-parallel and world groups (`across_replicas`: waits on the other replicas).
struct CollectiveTime {
  double all = 0.0;
  double across_replicas = 0.0;
};
CollectiveTime CollectiveSeconds(const comm::CollectiveStats& stats) {
  CollectiveTime t;
  for (const auto& [key, c] : stats.Snapshot()) {
    t.all += c.seconds;
    const std::string group = key.substr(key.rfind('/') + 1);
    if (group == "dp" || group == "world") t.across_replicas += c.seconds;
  }
  return t;
}

c10::Device TorchDevice(const comm::Device& d) {
  if (d.is_cpu()) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d.index));
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(const JobSpec& spec, comm::ProcessGroups* g, const EngineOptions& opts)
      : spec_(spec), g_(g), opts_(opts), schedule_(spec.scheduler, spec.optimizer.lr) {}

  absl::Status Init() {
    auto layout = BuildTpLayout(spec_.model, g_->tp, g_->tp_rank);
    if (!layout.ok()) return layout.status();
    device_ = TorchDevice(opts_.device);
    if (device_.is_cuda()) {  // TF32 only with latchkey.tf32: fp32 stays exact fp32 otherwise
      at::globalContext().setAllowTF32CuBLAS(spec_.tf32);
      at::globalContext().setAllowTF32CuDNN(spec_.tf32);
    }
    auto ops = MakeFlatOps(device_);
    if (!ops.ok()) return ops.status();
    ops_ = *std::move(ops);
    LK_ASSIGN_OR_RETURN(memory_, memory::MakeMemoryMeter(!device_.is_cpu(), device_.index()));
    memory::ScopedAccount account(memory_->account());  // the model's buffers are its bytes
    // ZeRO-1 and 2 partition the optimizer state alike; 2 also keeps only the gradient partition.
    const GradSyncPlan plan = PlanGradSync(spec_, *g_, opts_.overlap_dp_reduction);
    const bool zero1 = plan.partitioned();
    store_ = std::make_unique<ParamStore>(*std::move(layout), zero1 ? g_->dp : 1, device_,
                                          /*attach_grads=*/plan.kind != GradSyncKind::kPartition);
    if (spec_.bf16) store_->EnableBf16Compute();
    LK_RETURN_IF_ERROR(LoadInitialWeights());
    model_ = std::make_unique<GptBigCode>(spec_.model, store_.get(), g_->tp_group.get(), spec_.seed,
                                          spec_.sequence_parallel);
    model_->set_activation_checkpointing(spec_.activation_checkpointing);
    auto data = OpenDataSource(spec_);
    if (!data.ok()) return data.status();
    data_ = *std::move(data);
    if (!opts_.dump_samples_file.empty()) {
      LK_ASSIGN_OR_RETURN(dump_, SampleDump::Open(opts_.dump_samples_file, g_->rank, g_->dp_rank,
                                                  g_->tp_rank, opts_.dump_samples_micro_batches));
    }
    if (spec_.eval.enabled()) {
      auto evaluator = Evaluator::Open(spec_, g_, device_);
      if (!evaluator.ok()) return evaluator.status();
      evaluator_ = *std::move(evaluator);
    }
    state_.spec = &spec_;
    state_.groups = g_;
    state_.ops = ops_.get();
    state_.params = store_.get();
    state_.model = model_.get();
    if (zero1) {
      const int64_t chunk = store_->padded_numel() / g_->dp;
      state_.part_begin = g_->dp_rank * chunk;
      state_.part_end = state_.part_begin + chunk;
    } else {
      state_.part_begin = 0;
      state_.part_end = store_->numel();
    }
    state_.zero1 = zero1;
    // bf16: the fp32 master lives here, only for this rank's partition (ZeRO-1) or whole.
    if (spec_.bf16) state_.master = store_->TakeMaster(state_.part_begin, state_.part_end);
    optimizer_ = MakeOptimizer(spec_.optimizer, state_.part_numel(), ops_.get());
    state_.optimizer = optimizer_.get();
    // After EnableBf16Compute and TakeMaster: bucket hooks go on the parameters the model uses.
    // Under sequence parallelism the LayerNorm and row-parallel bias gradients are partial per
    // TP rank: summed with the K/V rows, in the same reduction.
    GradSyncEnv env;
    env.spec = &spec_;
    env.groups = g_;
    env.store = store_.get();
    env.ops = ops_.get();
    env.state = &state_;
    env.device = device_;
    env.skip_kv_reduction_for_testing = opts_.skip_kv_reduction_for_testing;
    sync_ = MakeGradSync(plan, env);
    return absl::OkStatus();
  }

  absl::StatusOr<StepReport> RunWindow(const Latch& latch) override {
    if (latch.n < 1 || static_cast<int>(latch.no_sync.size()) != latch.n) {
      return absl::InvalidArgumentError(
          "latch for window " + std::to_string(latch.window) + ": no_sync mask has " +
          std::to_string(latch.no_sync.size()) + " entries for n=" + std::to_string(latch.n));
    }
    if (!latch.replica_micro_batches.empty()) {
      if (std::string why = SplitProblem(latch, g_->dp, latch.replica_micro_batches);
          !why.empty()) {
        return absl::InvalidArgumentError("latch for window " + std::to_string(latch.window) +
                                          ": replica_micro_batches: " + why);
      }
    }
    if (latch.kv_mode != KvMode::kPerMicroBatch && !BoundaryReductionAllowed(spec_.zero_stage)) {
      return absl::FailedPreconditionError("latch for window " + std::to_string(latch.window) +
                                           " asks for " + KvModeName(latch.kv_mode) +
                                           " K/V reduction, which ZeRO stage " +
                                           std::to_string(spec_.zero_stage) + " cannot execute");
    }
    if (g_->recorder) g_->recorder->BeginWindow(latch.window, RankPhase::kCompute);
    const auto start = Clock::now();
    memory::ScopedAccount account(memory_->account());
    memory_->ResetPeak();
    const auto stats_before = g_->stats->Snapshot();
    const int64_t kv_before = g_->stats->TaggedCalls(comm::kKvTag);
    const int64_t replicated_before = ReplicatedCalls(*g_->stats);
    const double lr = schedule_.ForStep(latch.window);
    absl::StatusOr<double> loss = Window(latch, lr);
    if (!loss.ok()) return loss.status();
    const bool applied = std::isfinite(*loss) && std::isfinite(last_norm_);
    if (applied) {
      state_.position = {
          latch.window, latch.generation, latch.first_micro_batch + latch.n,
          FirstSample(latch) + static_cast<int64_t>(latch.n) * g_->dp * spec_.micro_batch_size};
    }
    StepReport r;
    r.lr = lr;
    r.step = latch.window;
    r.micro_batches = latch.n;
    r.replica_micro_batches = ReplicaMicroBatches(latch, g_->dp_rank);
    r.compute_seconds = compute_seconds_;
    r.micro_batch_seconds = micro_batch_seconds_;
    r.loss = *loss;
    r.grad_norm = last_norm_;
    r.kv_mode = latch.kv_mode;
    r.latch_generation = latch.generation;
    r.kv_allreduce_calls = g_->stats->TaggedCalls(comm::kKvTag) - kv_before;
    r.replicated_allreduce_calls = ReplicatedCalls(*g_->stats) - replicated_before;
    for (const auto& [key, c] : comm::CollectiveStats::Delta(g_->stats->Snapshot(), stats_before)) {
      r.collective_calls[key] = c.calls;
      r.collective_seconds += c.seconds;
    }
    r.tokens = static_cast<int64_t>(latch.n) * spec_.micro_batch_size * g_->dp * spec_.seq_len;
    r.optimizer_state_bytes = optimizer_state_bytes();
    r.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.boundary_wait_seconds = std::max(sync_->boundary_wait(), 0.0);
    const memory::MemoryReading mem = memory_->Read();
    r.peak_memory_bytes = mem.peak_bytes;
    r.activation_memory_bytes = activation_bytes_;
    r.reserved_memory_bytes = mem.reserved_bytes;
    // After an applied update, outside the step's time and collective counts (its own tag).
    if (applied && evaluator_ && evaluator_->Due(latch.window)) {
      if (g_->recorder) g_->recorder->SetPhase(RankPhase::kEval);
      comm::ScopedSpan eval(timeline(), comm::SpanKind::kEval, latch.window);
      absl::StatusOr<double> eval_loss = evaluator_->Run(*model_);
      if (!eval_loss.ok()) return eval_loss.status();
      r.eval_loss = *eval_loss;
    }
    return r;
  }

  int64_t optimizer_state_bytes() const override {
    const int64_t master = state_.bf16() ? state_.master.numel() * 4 : 0;
    return optimizer_->state_bytes() + master;
  }

  TrainingState& state() override { return state_; }

  BucketTrace last_bucket_trace() const override {
    BucketTrace t;
    t.issued = sync_->bucket_issue_times();
    t.backward_end = backward_end_;
    return t;
  }

  int64_t peak_gradient_bytes() const override { return sync_->peak_gradient_bytes(); }

 private:
  comm::Timeline* timeline() const { return g_->recorder ? g_->recorder->timeline() : nullptr; }

  // The full weights this shard starts from: spec.init_from through the checkpoint module's
  // reader, or the seed's initialisation.
  absl::Status LoadInitialWeights() {
    if (!spec_.init_from.empty()) {
      if (!opts_.load_init_from) {
        return absl::FailedPreconditionError(
            "latchkey.init_from: this engine was built without a checkpoint reader "
            "(EngineOptions::load_init_from)");
      }
      return opts_.load_init_from(spec_, g_->tp_rank, *store_);
    }
    if (absl::Status st =
            store_->LoadFromFull(InitFullWeights(spec_.model, spec_.seed), g_->tp_rank);
        !st.ok()) {
      return absl::InvalidArgumentError("latchkey.init_from: " + std::string(st.message()));
    }
    return absl::OkStatus();
  }

  // Runs the window and its update with learning rate `lr`; returns the window's mean loss.
  // Three stages, in this order: the micro-batches, the boundary reduction, the optimizer step.
  // A loss or global grad norm that is not finite stops the window before its optimizer step
  // (Megatron's --check-for-nan-in-loss-and-grad): nothing applied, on every rank alike.
  absl::StatusOr<double> Window(const Latch& latch, double lr) {
    LK_ASSIGN_OR_RETURN(const double loss_sum, MicroBatches(latch));
    comm::ScopedSpan boundary(timeline(), comm::SpanKind::kBoundary, latch.window);
    LK_ASSIGN_OR_RETURN(const double loss, ReduceGrads(loss_sum / latch.n));
    boundary.End();
    if (!std::isfinite(loss) || !std::isfinite(last_norm_)) return loss;
    if (latch.window == opts_.dump_grads_step && !opts_.dump_grads_dir.empty()) {
      if (!opts_.write_grads) {
        return absl::FailedPreconditionError(
            "--dump-grads: this engine was built without a gradient writer "
            "(EngineOptions::write_grads)");
      }
      LK_RETURN_IF_ERROR(opts_.write_grads(state_, opts_.dump_grads_dir));
    }
    comm::ScopedSpan optimizer(timeline(), comm::SpanKind::kOptimizer, latch.window);
    LK_RETURN_IF_ERROR(StepOptimizer(lr));
    return loss;
  }

  // Forward and backward of this replica's micro-batches of the window (n, or its share of an
  // uneven split); the strategy synchronises the gradient around each backward (grad_sync.h).
  // Each backward is of loss / n, the window's n whatever this replica's share: the DP mean of
  // the replicas' sums is then the sum over the window's n * DP micro-batches / (n * DP), the
  // same gradient for every split. Returns the sum of this rank's losses.
  absl::StatusOr<double> MicroBatches(const Latch& latch) {
    const int mb = spec_.micro_batch_size;
    const int S = spec_.seq_len;
    const int64_t first_sample = FirstSample(latch);
    const int count = ReplicaMicroBatches(latch, g_->dp_rank);
    // The strategy sees this replica's window: `count` micro-batches, the last one the boundary.
    sync_->BeginWindow(ReplicaLatch(latch, count));
    const auto start = Clock::now();
    const CollectiveTime before = CollectiveSeconds(*g_->stats);
    double loss_sum = 0.0;
    at::Tensor tokens = at::empty({mb, S + 1}, at::kLong);  // host: the data source fills it
    std::vector<int64_t> rows(mb);
    for (int m = 0; m < count; ++m) {
      if (g_->recorder) g_->recorder->SetMicroBatch(m);
      comm::ScopedSpan micro_batch(timeline(), comm::SpanKind::kMicroBatch, latch.window, m);
      comm::ScopedSpan data(timeline(), comm::SpanKind::kData, latch.window, m);
      int64_t* t = tokens.data_ptr<int64_t>();
      for (int b = 0; b < mb; ++b) {
        // The row's stream position (not wrapped): it picks the sample (modulo the data size)
        // and the model's dropout masks, so any DP x GAS split of the same global batch draws
        // the same masks for the same row, and a second pass over the data new ones.
        rows[b] = StreamPosition(
            first_sample, MicroBatchSlot(latch.replica_micro_batches, g_->dp, g_->dp_rank, m), mb,
            b);
        if (absl::Status st = data_->Read(rows[b], t + b * (S + 1)); !st.ok()) return st;
      }
      if (dump_ && dump_->wants_more()) LK_RETURN_IF_ERROR(DumpSamples(latch, m, rows, t));
      at::Tensor ids = tokens.narrow(1, 0, S).to(device_);
      at::Tensor labels = tokens.narrow(1, 1, S).to(device_);
      data.End();
      const bool last = m == count - 1;
      sync_->BeforeBackward(m);
      const int64_t allocated_before = last ? memory_->AllocatedBytes() : 0;
      comm::ScopedSpan forward(timeline(), comm::SpanKind::kForward, latch.window, m);
      at::Tensor loss = model_->Loss(ids, labels, rows);
      if (last) activation_bytes_ = memory_->AllocatedBytes() - allocated_before;
      loss_sum += loss.item<double>();
      forward.End();
      comm::ScopedSpan backward(timeline(), comm::SpanKind::kBackward, latch.window, m);
      (loss / static_cast<double>(latch.n)).backward();
      backward.End();
      if (last) backward_end_ = Clock::now();
      LK_RETURN_IF_ERROR(sync_->AfterBackward(m));
    }
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    const CollectiveTime after = CollectiveSeconds(*g_->stats);
    compute_seconds_ = std::max(0.0, wall - (after.all - before.all));
    micro_batch_seconds_ = std::max(0.0, wall - (after.across_replicas - before.across_replicas));
    return loss_sum;
  }

  // The boundary reduction (grad_sync.h: Finish) -> the global grad norm (last_norm_). `loss` is
  // this rank's mean loss; returns the window's, the mean over DP. Both are the same on every
  // rank, non-finite ones too (Window's verdict).
  absl::StatusOr<double> ReduceGrads(double loss) {
    LK_ASSIGN_OR_RETURN(const GradSync::Result r, sync_->Finish(loss));
    last_norm_ = std::sqrt(r.norm_sq);
    return r.loss;
  }

  // The update of this rank's partition with learning rate `lr`: clip (by last_norm_) ->
  // optimizer step on the fp32 values (the master in bf16 mode, else the parameters) -> bf16:
  // the compute copy rounded from the master -> ZeRO-1: the all-gather of every partition.
  absl::Status StepOptimizer(double lr) {
    const int64_t chunk = state_.part_numel();
    const at::Tensor grads_part = sync_->partition();
    const at::Tensor params_part =
        state_.bf16() ? state_.master : store_->flat_params().narrow(0, state_.part_begin, chunk);
    const double coef = ClipCoefficient(last_norm_, spec_.gradient_clipping);
    if (coef < 1.0) ops_->Scale(grads_part, static_cast<float>(coef));
    optimizer_->Step(params_part, grads_part, lr);
    if (state_.bf16()) {
      // bf16: the next window computes with the updated master, rounded once to bf16.
      const at::Tensor& compute = store_->flat_compute();
      const at::Tensor compute_part = compute.narrow(0, state_.part_begin, chunk);
      ops_->Copy(compute_part, state_.master);
      if (state_.zero1) {
        LK_RETURN_IF_ERROR(g_->dp_group->AllGather(CommBuffer(compute_part), CommBuffer(compute)));
      }
    } else if (state_.zero1) {
      // In place: this rank's partition already sits at its offset.
      LK_RETURN_IF_ERROR(
          g_->dp_group->AllGather(CommBuffer(params_part), CommBuffer(store_->flat_params())));
    }
    return absl::OkStatus();
  }

  // The window's first stream position. A coordinator that predates Latch::first_sample sends
  // 0 for every window; its jobs run one layout, where the position is M_s * DP * MB.
  // --dump-samples: micro-batch m of the window as the forward reads it.
  absl::Status DumpSamples(const Latch& latch, int m, const std::vector<int64_t>& rows,
                           const int64_t* tokens) {
    std::vector<int64_t> samples(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) samples[b] = rows[b] % data_->num_samples();
    return dump_->Record(latch.window, m, rows, samples, tokens, spec_.seq_len + 1);
  }

  int64_t FirstSample(const Latch& latch) const {
    if (latch.first_sample > 0 || latch.first_micro_batch == 0) return latch.first_sample;
    return latch.first_micro_batch * g_->dp * spec_.micro_batch_size;
  }

  JobSpec spec_;
  comm::ProcessGroups* g_;
  EngineOptions opts_;
  LrSchedule schedule_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::unique_ptr<FlatOps> ops_;  // before everything that computes through it
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<GptBigCode> model_;
  Clock::time_point backward_end_;  // of the last micro-batch of the last window
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<SampleDump> dump_;             // --dump-samples, else null
  std::unique_ptr<Evaluator> evaluator_;         // latchkey.eval; null without it
  std::unique_ptr<memory::MemoryMeter> memory_;  // this engine's bytes (worker/memory/)
  int64_t activation_bytes_ = 0;                 // of the window running (StepReport's)
  double compute_seconds_ = 0.0;                 // of the window running (StepReport's)
  double micro_batch_seconds_ = 0.0;             // of the window running (StepReport's)
  // The view of everything above a checkpoint saves, the ZeRO partition [part_begin, part_end),
  // the bf16 fp32 master of it, and the data position (training_state.h).
  TrainingState state_;
  // The data-parallel gradient synchronisation (grad_sync.h): after everything it works on, so
  // it goes (with its bucket hooks) first.
  std::unique_ptr<GradSync> sync_;
  double last_norm_ = 0.0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const JobSpec& spec,
                                                     comm::ProcessGroups* groups,
                                                     const EngineOptions& options) {
  if (groups->tp != spec.tp || groups->world_size != spec.world_size) {
    return absl::InvalidArgumentError(
        "latchkey.world_size: the process group (world " + std::to_string(groups->world_size) +
        ", tp " + std::to_string(groups->tp) + ") does not match the spec (world " +
        std::to_string(spec.world_size) + ", tp " + std::to_string(spec.tp) + ")");
  }
  auto engine = std::make_unique<EngineImpl>(spec, groups, options);
  if (absl::Status st = engine->Init(); !st.ok()) return st;
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace latchkey
