#include "worker/train/engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/crash_point.h"
#include "common/status_macros.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/data/token_source.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"
#include "worker/train/evaluator.h"
#include "worker/train/flat_ops.h"
#include "worker/train/grad_norm.h"
#include "worker/train/kv_reducer.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/optimizer.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<at::Tensor> ToFloatTensor(const StTensor& t) {
  const std::map<StDtype, at::ScalarType> kTypes = {{StDtype::kF32, at::kFloat},
                                                    {StDtype::kF64, at::kDouble},
                                                    {StDtype::kBF16, at::kBFloat16},
                                                    {StDtype::kF16, at::kHalf}};
  auto type = kTypes.find(t.dtype);
  if (type == kTypes.end()) {
    return absl::InvalidArgumentError("tensor " + t.name + " has non-float dtype " +
                                      StDtypeName(t.dtype));
  }
  at::Tensor view = at::from_blob(const_cast<char*>(t.data.data()), t.shape, type->second);
  return view.to(at::kFloat).clone();
}

c10::Device TorchDevice(const comm::Device& d) {
  if (d.is_cpu()) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d.index));
}

// The bytes of `t` as they are (its dtype is `dtype`), shape kept.
StTensor RawStTensor(const std::string& name, const at::Tensor& t, StDtype dtype) {
  StTensor out{name, dtype, t.sizes().vec(), {}};
  at::Tensor c = t.cpu().contiguous();
  out.data.assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

StTensor ToStTensor(const std::string& name, const at::Tensor& t) {
  return RawStTensor(name, t.to(at::kFloat), StDtype::kF32);
}

// A host copy of `file`'s tensor `name`, which must have `dtype` and `numel` elements.
absl::StatusOr<at::Tensor> RawTensor(const StFile& file, const std::string& source,
                                     const std::string& name, StDtype dtype, at::ScalarType type,
                                     int64_t numel) {
  const StTensor* t = file.Find(name);
  if (t == nullptr) return absl::DataLossError(source + ": no tensor " + name);
  if (t->dtype != dtype || (numel >= 0 && t->NumElements() != numel)) {
    return absl::FailedPreconditionError(
        source + ": " + name + " is " + StDtypeName(t->dtype) + " with " +
        std::to_string(t->NumElements()) + " elements, this rank needs " + StDtypeName(dtype) +
        (numel >= 0 ? " with " + std::to_string(numel) : std::string()));
  }
  return at::from_blob(const_cast<char*>(t->data.data()), {t->NumElements()}, type).clone();
}

// The confirmation record of one rank: ok, bytes, SHA-256 words.
constexpr int kRecord = 10;

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
    const bool zero1 = spec_.zero_stage == 1 && comm::is_parallel(g_->dp_group);
    store_ = std::make_unique<ParamStore>(*std::move(layout), zero1 ? g_->dp : 1, device_);
    if (spec_.bf16) store_->EnableBf16Compute();
    std::map<std::string, at::Tensor> full;
    if (!spec_.init_from.empty()) {
      auto ckpt = ReadHfCheckpoint(spec_.init_from);
      if (!ckpt.ok()) {
        return absl::Status(ckpt.status().code(),
                            "latchkey.init_from: " + std::string(ckpt.status().message()));
      }
      LK_RETURN_IF_ERROR(CheckConfigAgrees(spec_.model, ckpt->config, "latchkey.init_from"));
      for (const StTensor& t : ckpt->weights.tensors) {
        if (t.name == "lm_head.weight") continue;  // tied to wte
        auto tensor = ToFloatTensor(t);
        if (!tensor.ok()) return tensor.status();
        full[t.name] = *tensor;
      }
    } else {
      full = InitFullWeights(spec_.model, spec_.seed);
    }
    if (absl::Status st = store_->LoadFromFull(full, g_->tp_rank); !st.ok()) {
      return absl::InvalidArgumentError("latchkey.init_from: " + std::string(st.message()));
    }
    model_ = std::make_unique<GptBigCode>(spec_.model, store_.get(), g_->tp_group.get(), spec_.seed,
                                          g_->dp_rank);
    kv_ = std::make_unique<KvReducer>(store_->segments(), g_->tp_group.get(), ops_.get());
    kv_->set_enabled_for_testing(!opts_.skip_kv_reduction_for_testing);
    auto data = OpenDataSource(spec_);
    if (!data.ok()) return data.status();
    data_ = *std::move(data);
    if (spec_.eval.enabled()) {
      auto evaluator = Evaluator::Open(spec_, g_, device_);
      if (!evaluator.ok()) return evaluator.status();
      evaluator_ = *std::move(evaluator);
    }
    if (zero1) {
      const int64_t chunk = store_->padded_numel() / g_->dp;
      part_begin_ = g_->dp_rank * chunk;
      part_end_ = part_begin_ + chunk;
    } else {
      part_begin_ = 0;
      part_end_ = store_->numel();
    }
    zero1_ = zero1;
    // bf16: the fp32 master lives here, only for this rank's partition (ZeRO-1) or whole.
    if (spec_.bf16) master_ = store_->TakeMaster(part_begin_, part_end_);
    optimizer_ = MakeOptimizer(spec_.optimizer, part_end_ - part_begin_, ops_.get());
    return absl::OkStatus();
  }

  absl::StatusOr<StepReport> RunWindow(const Latch& latch) override {
    if (latch.n < 1 || static_cast<int>(latch.no_sync.size()) != latch.n) {
      return absl::InvalidArgumentError(
          "latch for window " + std::to_string(latch.window) + ": no_sync mask has " +
          std::to_string(latch.no_sync.size()) + " entries for n=" + std::to_string(latch.n));
    }
    if (latch.kv_mode != KvMode::kPerMicroBatch && !BoundaryReductionAllowed(spec_.zero_stage)) {
      return absl::FailedPreconditionError("latch for window " + std::to_string(latch.window) +
                                           " asks for " + KvModeName(latch.kv_mode) +
                                           " K/V reduction, which ZeRO stage " +
                                           std::to_string(spec_.zero_stage) + " cannot execute");
    }
    if (g_->recorder) g_->recorder->BeginWindow(latch.window, RankPhase::kCompute);
    const auto start = Clock::now();
    boundary_wait_ = -1.0;
    const auto stats_before = g_->stats->Snapshot();
    const int64_t kv_before = g_->stats->TaggedCalls(comm::kKvTag);
    const double lr = schedule_.ForStep(latch.window);
    absl::StatusOr<double> loss = Window(latch, lr);
    if (!loss.ok()) return loss.status();
    StepReport r;
    r.lr = lr;
    r.step = latch.window;
    r.micro_batches = latch.n;
    r.loss = *loss;
    r.grad_norm = last_norm_;
    r.kv_mode = latch.kv_mode;
    r.latch_generation = latch.generation;
    r.kv_allreduce_calls = g_->stats->TaggedCalls(comm::kKvTag) - kv_before;
    for (const auto& [key, c] : comm::CollectiveStats::Delta(g_->stats->Snapshot(), stats_before)) {
      r.collective_calls[key] = c.calls;
    }
    r.tokens = static_cast<int64_t>(latch.n) * spec_.micro_batch_size * g_->dp * spec_.seq_len;
    r.optimizer_state_bytes = optimizer_state_bytes();
    r.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.boundary_wait_seconds = std::max(boundary_wait_, 0.0);
    // After the update, outside the step's time and collective counts (its own tag).
    if (evaluator_ && evaluator_->Due(latch.window)) {
      if (g_->recorder) g_->recorder->SetPhase(RankPhase::kEval);
      absl::StatusOr<double> eval_loss = evaluator_->Run(*model_);
      if (!eval_loss.ok()) return eval_loss.status();
      r.eval_loss = *eval_loss;
    }
    return r;
  }

  absl::Status SaveCheckpoint(const std::string& dir) override {
    const int64_t n = store_->numel();
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
    at::Tensor local;
    if (!master_.defined()) {
      local = store_->flat_params().narrow(0, 0, n);
    } else if (zero1_) {
      // Reassemble the fp32 master from the DP partitions.
      at::Tensor full = at::empty({store_->padded_numel()}, f32);
      LK_RETURN_IF_ERROR(g_->dp_group->AllGather(CommBuffer(master_), CommBuffer(full)));
      local = full.narrow(0, 0, n);
    } else {
      local = master_.narrow(0, 0, n);
    }
    at::Tensor gathered = at::empty({g_->tp * n}, f32);
    LK_RETURN_IF_ERROR(g_->tp_group->AllGather(CommBuffer(local), CommBuffer(gathered)));
    if (g_->rank != 0) return absl::OkStatus();
    gathered = gathered.cpu();
    std::vector<std::vector<ParamLayout>> layouts;
    std::vector<at::Tensor> flats;
    for (int r = 0; r < g_->tp; ++r) {
      layouts.push_back(*BuildTpLayout(spec_.model, g_->tp, r));
      flats.push_back(gathered.narrow(0, r * n, n));
    }
    StFile file;
    for (const auto& [name, t] : AssembleFull(layouts, flats)) {
      file.tensors.push_back(ToStTensor(name, t));
    }
    return WriteHfCheckpoint(dir, spec_.model, std::move(file));
  }

  int64_t optimizer_state_bytes() const override {
    const int64_t master = master_.defined() ? master_.numel() * 4 : 0;
    return optimizer_->state_bytes() + master;
  }

  absl::StatusOr<CheckpointCommit> SaveTrainingCheckpoint(
      const TrainingCheckpointRequest& req) override {
    if (g_->recorder) g_->recorder->SetPhase(RankPhase::kCheckpoint);
    const auto start = Clock::now();
    const std::string temp = JoinPath(req.root, CheckpointTempDirName(req.step, req.attempt));
    absl::StatusOr<CheckpointFileEntry> entry =
        WriteCheckpointRankFile(temp, g_->rank, RankState(req.step));
    if (entry.ok()) MaybeCrash("checkpoint.after_rank_files", g_->rank, req.step);
    // Confirmations: every rank's record (ok, bytes, SHA-256 words) reaches every rank.
    double mine[kRecord] = {};
    if (entry.ok()) {
      mine[0] = 1.0;
      mine[1] = static_cast<double>(entry->bytes);
      Sha256ToWords(entry->sha256, mine + 2);
    }
    std::vector<double> all(kRecord * g_->world_size);
    LK_RETURN_IF_ERROR(ExchangeDoubles(mine, kRecord, all.data(), /*gather=*/true));
    if (!entry.ok()) return entry.status();
    CheckpointManifest manifest = Manifest(req);
    CheckpointCommit c;
    std::string failed;
    for (int r = 0; r < g_->world_size; ++r) {
      const double* x = all.data() + r * kRecord;
      if (x[0] != 1.0) failed += (failed.empty() ? "" : ",") + std::to_string(r);
      manifest.files.push_back(
          {CheckpointRankFileName(r), static_cast<int64_t>(x[1]), Sha256FromWords(x + 2)});
      c.bytes += static_cast<int64_t>(x[1]);
    }
    if (!failed.empty()) {
      return absl::InternalError("checkpoint of step " + std::to_string(req.step) + " in " + temp +
                                 ": rank(s) " + failed + " could not write their file");
    }
    // Rank 0 commits; its outcome (ok, manifest SHA-256) reaches every rank, then a barrier.
    double outcome[9] = {};
    absl::Status commit_status;
    if (g_->rank == 0) {
      MaybeCrash("checkpoint.before_commit", g_->rank, req.step);
      absl::StatusOr<std::string> sha = CommitCheckpoint(req.root, temp, manifest);
      outcome[0] = sha.ok() ? 1.0 : 0.0;
      if (sha.ok()) Sha256ToWords(*sha, outcome + 1);
      commit_status = sha.status();
    }
    LK_RETURN_IF_ERROR(ExchangeDoubles(outcome, 9, outcome, /*gather=*/false));
    LK_RETURN_IF_ERROR(g_->world->Barrier());
    LK_RETURN_IF_ERROR(commit_status);
    if (outcome[0] != 1.0) {
      return absl::InternalError("checkpoint of step " + std::to_string(req.step) +
                                 ": rank 0 could not commit " + temp);
    }
    c.step = req.step;
    c.dir = JoinPath(req.root, CheckpointStepDirName(req.step));
    c.manifest_sha256 = Sha256FromWords(outcome + 1);
    c.blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return c;
  }

  absl::Status LoadTrainingCheckpoint(const std::string& step_dir,
                                      const std::string& expected_job_id,
                                      const std::string& manifest_sha256) override {
    if (g_->recorder) g_->recorder->SetPhase(RankPhase::kCheckpoint);
    LK_ASSIGN_OR_RETURN(const CheckpointManifest m, VerifyCheckpoint(step_dir, manifest_sha256));
    LK_RETURN_IF_ERROR(CheckManifestFits(step_dir, m, Manifest({}), expected_job_id));
    LK_ASSIGN_OR_RETURN(const StFile file, ReadCheckpointRankFile(step_dir, g_->rank));
    const std::string src = JoinPath(step_dir, CheckpointRankFileName(g_->rank));
    const auto meta = [&](const std::string& key) -> int64_t {
      auto it = file.metadata.find(key);
      return it == file.metadata.end() ? -1 : std::atoll(it->second.c_str());
    };
    if (meta("rank") != g_->rank || meta("tp_rank") != g_->tp_rank ||
        meta("dp_rank") != g_->dp_rank || meta("step") != m.step || meta("optimizer_step") < 0) {
      return absl::DataLossError(
          src + ": metadata (rank, tp_rank, dp_rank, step, optimizer_step) " +
          "does not fit rank " + std::to_string(g_->rank) + " of step " + std::to_string(m.step));
    }
    // Read and check everything before anything is replaced.
    absl::Status bad;
    const auto read = [&](const std::string& name, StDtype dtype, at::ScalarType type,
                          int64_t count) {
      absl::StatusOr<at::Tensor> t = RawTensor(file, src, name, dtype, type, count);
      if (!t.ok() && bad.ok()) bad = t.status();
      return t.ok() ? *t : at::Tensor();
    };
    const int64_t n = store_->numel();
    const int64_t chunk = part_end_ - part_begin_;
    const bool bf16 = master_.defined();
    const at::Tensor params = read("params", StDtype::kF32, at::kFloat, n);
    const at::Tensor master = bf16 ? read("master", StDtype::kF32, at::kFloat, chunk) : params;
    std::map<std::string, at::Tensor> opt;
    for (const auto& [name, t] : optimizer_->state()) {
      opt[name] = read("optimizer." + name, StDtype::kF32, at::kFloat, chunk);
    }
    const at::Tensor rng_replicated = read("rng.replicated", StDtype::kU8, at::kByte,
                                           model_->replicated_generator_state().numel());
    const at::Tensor rng_local =
        read("rng.local", StDtype::kU8, at::kByte, model_->local_generator_state().numel());
    LK_RETURN_IF_ERROR(bad);
    if (absl::Status st = optimizer_->LoadState(meta("optimizer_step"), opt); !st.ok()) {
      return absl::DataLossError(src + ": " + std::string(st.message()));
    }
    model_->set_generator_states(rng_replicated, rng_local);
    if (!bf16) {
      ops_->Copy(store_->flat_params().narrow(0, 0, n), params.to(device_));
      return absl::OkStatus();
    }
    // The compute copy: the saved one, with this rank's partition recomputed from the master
    // exactly as Window() does after a step; the two must agree.
    ops_->Copy(master_, master.to(device_));
    const at::Tensor& compute = store_->flat_compute();
    ops_->Copy(compute.narrow(0, 0, n), params.to(device_));
    ops_->Copy(compute.narrow(0, part_begin_, chunk), master_);
    if (!at::equal(compute.narrow(0, 0, n).cpu().to(at::kFloat), params)) {
      return absl::DataLossError(src + ": params disagree with the bf16 rounding of master");
    }
    return absl::OkStatus();
  }

 private:
  // Runs the window and its update with learning rate `lr`; returns the window's mean loss.
  absl::StatusOr<double> Window(const Latch& latch, double lr) {
    const at::Tensor& grads = store_->flat_grads();
    const int64_t numel = store_->numel();
    const int64_t chunk = part_end_ - part_begin_;
    // This rank's partition of the gradient (ZeRO-1) or all of it, and the fp32 values the
    // optimizer updates there: the master partition (bf16) or the parameters.
    const at::Tensor grads_part = grads.narrow(0, part_begin_, chunk);
    const at::Tensor params_part =
        master_.defined() ? master_ : store_->flat_params().narrow(0, part_begin_, chunk);
    const int mb = spec_.micro_batch_size;
    const int S = spec_.seq_len;
    store_->ZeroGrads();
    kv_->BeginWindow();
    double loss_sum = 0.0;
    at::Tensor tokens = at::empty({mb, S + 1}, at::kLong);  // host: the data source fills it
    for (int m = 0; m < latch.n; ++m) {
      if (g_->recorder) g_->recorder->SetMicroBatch(m);
      int64_t* t = tokens.data_ptr<int64_t>();
      for (int b = 0; b < mb; ++b) {
        data_->Sample(SampleIndex(latch.first_micro_batch, m, g_->dp, g_->dp_rank, mb, b),
                      t + b * (S + 1));
      }
      at::Tensor ids = tokens.narrow(1, 0, S).to(device_);
      at::Tensor labels = tokens.narrow(1, 1, S).to(device_);
      at::Tensor loss = model_->Loss(ids, labels);
      loss_sum += loss.item<double>();
      (loss / static_cast<double>(latch.n)).backward();
      AccumulateComputeGrads();
      kv_->NoteBackward();
      if (latch.kv_mode == KvMode::kPerMicroBatch) {
        if (absl::Status st = kv_->ReducePending(grads, /*coalesced=*/false); !st.ok()) return st;
      }
      const bool last = m == latch.n - 1;
      if (!last && !latch.no_sync[m] && comm::is_parallel(g_->dp_group)) {
        // DDP semantics: the mean of the accumulated gradient (idempotent).
        if (absl::Status st = DpMeanAllReduce(grads.narrow(0, 0, numel)); !st.ok()) return st;
        if (absl::Status st = kv_->OnGradsReplaced(grads); !st.ok()) return st;
      }
    }
    // Boundary: K/V over TP -> DP -> norm -> clip -> step -> all-gather.
    if (latch.kv_mode != KvMode::kPerMicroBatch) {
      const bool coalesced = latch.kv_mode == KvMode::kCoalesced;
      const int64_t kv_calls = g_->stats->TaggedCalls(comm::kKvTag);
      const auto kv_start = Clock::now();
      if (absl::Status st = kv_->ReducePending(grads, coalesced); !st.ok()) return st;
      if (g_->stats->TaggedCalls(comm::kKvTag) != kv_calls) NoteBoundaryWait(kv_start);
    }
    double loss = loss_sum / latch.n;
    double norm_sq = 0.0;
    const bool count_replicated = g_->tp_rank == 0;
    if (zero1_) {
      // In place: the grads buffer is the scratch; only this rank's partition is used after.
      const auto dp_start = Clock::now();
      LK_RETURN_IF_ERROR(g_->dp_group->ReduceScatterSum(CommBuffer(grads), CommBuffer(grads_part)));
      NoteBoundaryWait(dp_start);
      ops_->Scale(grads_part, 1.0f / g_->dp);
      double both[2] = {LocalGradNormSq(*ops_, grads, store_->segments(), part_begin_, part_end_,
                                        count_replicated),
                        loss};
      if (absl::Status st = SumScalars(g_->world.get(), both, 2); !st.ok()) return st;
      norm_sq = both[0];
      loss = both[1] / g_->world_size;
    } else {
      if (comm::is_parallel(g_->dp_group)) {
        ops_->Set(grads, numel, static_cast<float>(loss));  // the loss rides in the spare slot
        const auto dp_start = Clock::now();
        if (absl::Status st = DpMeanAllReduce(grads.narrow(0, 0, numel + 1)); !st.ok()) return st;
        NoteBoundaryWait(dp_start);
        loss = ops_->Get(grads, numel);
        ops_->Set(grads, numel, 0.0f);
      }
      norm_sq = LocalGradNormSq(*ops_, grads, store_->segments(), 0, numel, count_replicated);
      if (comm::is_parallel(g_->tp_group)) {
        if (absl::Status st = SumScalars(g_->tp_group.get(), &norm_sq, 1); !st.ok()) return st;
      }
    }
    last_norm_ = std::sqrt(norm_sq);
    if (latch.window == opts_.dump_grads_step && !opts_.dump_grads_dir.empty()) {
      if (absl::Status st = DumpGrads(); !st.ok()) return st;
    }
    const double coef = ClipCoefficient(last_norm_, spec_.gradient_clipping);
    if (coef < 1.0) ops_->Scale(grads_part, static_cast<float>(coef));
    optimizer_->Step(params_part, grads_part, lr);
    if (master_.defined()) {
      // bf16: the next window computes with the updated master, rounded once to bf16.
      const at::Tensor& compute = store_->flat_compute();
      const at::Tensor compute_part = compute.narrow(0, part_begin_, chunk);
      ops_->Copy(compute_part, master_);
      if (zero1_) {
        LK_RETURN_IF_ERROR(g_->dp_group->AllGather(CommBuffer(compute_part), CommBuffer(compute)));
      }
    } else if (zero1_) {
      // In place: this rank's partition already sits at its offset.
      LK_RETURN_IF_ERROR(
          g_->dp_group->AllGather(CommBuffer(params_part), CommBuffer(store_->flat_params())));
    }
    return loss;
  }

  // This rank's file of a checkpoint after window `step` (docs/fault-tolerance.md).
  StFile RankState(int64_t step) const {
    StFile f;
    const bool bf16 = master_.defined();
    const at::Tensor& flat = bf16 ? store_->flat_compute() : store_->flat_params();
    // fp32 always: in bf16 mode the compute copy, widened exactly.
    f.tensors.push_back(
        RawStTensor("params", flat.narrow(0, 0, store_->numel()).to(at::kFloat), StDtype::kF32));
    if (bf16) f.tensors.push_back(RawStTensor("master", master_, StDtype::kF32));
    for (const auto& [name, t] : optimizer_->state()) {
      f.tensors.push_back(RawStTensor("optimizer." + name, t, StDtype::kF32));
    }
    f.tensors.push_back(
        RawStTensor("rng.replicated", model_->replicated_generator_state(), StDtype::kU8));
    f.tensors.push_back(RawStTensor("rng.local", model_->local_generator_state(), StDtype::kU8));
    f.metadata = {{"rank", std::to_string(g_->rank)},
                  {"tp_rank", std::to_string(g_->tp_rank)},
                  {"dp_rank", std::to_string(g_->dp_rank)},
                  {"step", std::to_string(step)},
                  {"optimizer_step", std::to_string(optimizer_->steps())}};
    return f;
  }

  // The manifest of a checkpoint after window req.step (files left empty).
  CheckpointManifest Manifest(const TrainingCheckpointRequest& req) const {
    return CheckpointManifest{req.job_id.empty() ? "standalone" : req.job_id,
                              req.step,
                              req.attempt,
                              req.latch_generation,
                              req.step + 1,
                              req.next_first_micro_batch,
                              g_->world_size,
                              g_->tp,
                              g_->dp,
                              spec_.zero_stage,
                              spec_.bf16,
                              spec_.optimizer.type == OptimizerType::kSgd ? "SGD" : "AdamW",
                              req.compute_threads,
                              spec_.model,
                              {},
                              static_cast<int64_t>(std::time(nullptr))};
  }

  // The first boundary collective of the window sets boundary_wait_ (the straggler measure).
  void NoteBoundaryWait(Clock::time_point start) {
    if (boundary_wait_ < 0) {
      boundary_wait_ = std::chrono::duration<double>(Clock::now() - start).count();
    }
  }

  // bf16: folds the last backward's bf16 gradients into the fp32 accumulation buffer.
  void AccumulateComputeGrads() {
    if (!store_->bf16()) return;
    const auto& layout = store_->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      at::Tensor& g = store_->compute_grad(i);
      if (!g.defined()) continue;
      ops_->AddTo(store_->flat_grads().narrow(0, store_->offset(i), layout[i].local_numel()),
                  g.reshape({-1}));
      at::NoGradGuard no_grad;
      g.zero_();
    }
  }

  absl::Status DpMeanAllReduce(const at::Tensor& grads) {
    if (absl::Status st = g_->dp_group->AllReduceSum(CommBuffer(grads)); !st.ok()) return st;
    ops_->Scale(grads, 1.0f / g_->dp);
    return absl::OkStatus();
  }

  // All-gathers n host doubles over the world into out (world_size * n), or broadcasts them
  // from rank 0 (out == values), through buffers on the training device.
  absl::Status ExchangeDoubles(double* values, int64_t n, double* out, bool gather) {
    at::Tensor in = at::from_blob(values, {n}, at::kDouble).to(device_);
    at::Tensor t = gather ? at::empty({n * g_->world_size}, in.options()) : in;
    LK_RETURN_IF_ERROR(gather ? g_->world->AllGather(CommBuffer(in), CommBuffer(t))
                              : g_->world->Broadcast(CommBuffer(t), 0));
    if (!t.is_cpu() || gather) std::memcpy(out, t.cpu().data_ptr<double>(), t.numel() * 8);
    return absl::OkStatus();
  }

  // Sums n host doubles over `group`, through a buffer on the training device (the same memory
  // on the CPU).
  absl::Status SumScalars(comm::Group* group, double* values, int64_t n) {
    at::Tensor t = at::from_blob(values, {n}, at::kDouble).to(device_);
    if (absl::Status st = group->AllReduceSum(CommBuffer(t)); !st.ok()) return st;
    if (!t.is_cpu()) std::memcpy(values, t.cpu().data_ptr<double>(), n * sizeof(double));
    return absl::OkStatus();
  }

  absl::Status DumpGrads() {
    at::Tensor grads = store_->flat_grads();
    if (zero1_) {
      // Only this rank's partition holds the reduced gradient; the in-place reduce-scatter used
      // the rest of the buffer as scratch. Gather every rank's partition into a copy.
      at::Tensor full = at::empty_like(grads);
      const at::Tensor part = grads.narrow(0, part_begin_, part_end_ - part_begin_);
      LK_RETURN_IF_ERROR(g_->dp_group->AllGather(CommBuffer(part), CommBuffer(full)));
      grads = full;
    }
    grads = grads.cpu();
    StFile file;
    const auto& layout = store_->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const at::Tensor g =
          grads.narrow(0, store_->offset(i), layout[i].local_numel()).view(layout[i].local_shape);
      file.tensors.push_back(ToStTensor(layout[i].name, g));
    }
    std::sort(file.tensors.begin(), file.tensors.end(),
              [](const StTensor& a, const StTensor& b) { return a.name < b.name; });
    std::filesystem::create_directories(opts_.dump_grads_dir);
    return WriteSafetensorsFile(
        opts_.dump_grads_dir + "/grads-rank" + std::to_string(g_->rank) + ".safetensors", file);
  }

  JobSpec spec_;
  comm::ProcessGroups* g_;
  EngineOptions opts_;
  LrSchedule schedule_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::unique_ptr<FlatOps> ops_;  // before everything that computes through it
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<GptBigCode> model_;
  std::unique_ptr<KvReducer> kv_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<Evaluator> evaluator_;  // latchkey.eval; null without it
  int64_t part_begin_ = 0;
  int64_t part_end_ = 0;
  bool zero1_ = false;
  double last_norm_ = 0.0;
  double boundary_wait_ = -1.0;  // of the window running; -1 until its first boundary collective
  at::Tensor master_;            // bf16 mode: fp32 master of [part_begin_, part_end_)
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
