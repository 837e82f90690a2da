#include "worker/model/param_store.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#include <cmath>
#include <cstdlib>
#include <iostream>

namespace latchkey {

ParamStore::ParamStore(std::vector<ParamLayout> layout, int pad_multiple, c10::Device device,
                       bool attach_grads)
    : layout_(std::move(layout)), device_(device) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamLayout& p = layout_[i];
    index_[p.name] = i;
    offsets_.push_back(numel_);
    if (p.kind == ShardKind::kCAttnMqa) {
      // Row-major: the K/V rows are the contiguous tail of the local tensor.
      const int64_t row = p.local_shape.size() == 2 ? p.local_shape[1] : 1;
      segments_.push_back({numel_, p.kv_row_begin * row, false, false});
      segments_.push_back({numel_ + p.kv_row_begin * row, p.kv_rows * row, true, true});
    } else {
      segments_.push_back({numel_, p.local_numel(), p.kind == ShardKind::kReplicated, false,
                           p.sequence_parallel_partial});
    }
    numel_ += p.local_numel();
  }
  const int64_t m = pad_multiple > 0 ? pad_multiple : 1;
  padded_numel_ = (numel_ + 1 + m - 1) / m * m;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  flat_params_ = at::zeros({padded_numel_}, f32);
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamLayout& p = layout_[i];
    at::Tensor view = flat_params_.narrow(0, offsets_[i], p.local_numel()).view(p.local_shape);
    at::Tensor leaf = view.detach();  // shares storage with the flat buffer
    leaf.set_requires_grad(true);
    params_.push_back(leaf);
  }
  if (attach_grads) AttachGrads();
}

void ParamStore::AttachGrads() {
  if (flat_grads_.defined()) return;
  flat_grads_ = at::zeros({padded_numel_}, at::TensorOptions().dtype(at::kFloat).device(device_));
  // The fp32 leaves exist until TakeMaster (bf16 mode drops them: its leaves are the bf16 copies,
  // whose gradients the engine folds in itself).
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamLayout& p = layout_[i];
    params_[i].mutable_grad() =
        flat_grads_.narrow(0, offsets_[i], p.local_numel()).view(p.local_shape);
  }
}

void ParamStore::ReleaseGrads() {
  for (at::Tensor& leaf : params_) leaf.mutable_grad().reset();
  flat_grads_ = at::Tensor();
}

const at::Tensor& ParamStore::param(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::cerr << "latchkey: internal error: no parameter named " << name << "\n";
    std::abort();
  }
  return bf16_ ? compute_params_[it->second] : params_[it->second];
}

void ParamStore::EnableBf16Compute() {
  bf16_ = true;
  compute_params_.clear();
  flat_compute_ =
      at::zeros({padded_numel_}, at::TensorOptions().dtype(at::kBFloat16).device(device_));
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamLayout& p = layout_[i];
    at::Tensor c =
        flat_compute_.narrow(0, offsets_[i], p.local_numel()).view(p.local_shape).detach();
    c.set_requires_grad(true);
    compute_params_.push_back(c);
  }
}

void ParamStore::SyncComputeParams() {
  if (!bf16_ || !flat_params_.defined()) return;
  at::NoGradGuard no_grad;
  flat_compute_.copy_(flat_params_);
}

at::Tensor ParamStore::TakeMaster(int64_t begin, int64_t end) {
  at::Tensor master = flat_params_.narrow(0, begin, end - begin).clone();
  // Drop the full fp32 copy: the fp32 leaves only existed to carry it.
  params_.clear();
  flat_params_ = at::Tensor();
  return master;
}

at::Tensor ParamStore::grad_view(size_t i) {
  const ParamLayout& p = layout_[i];
  return flat_grads_.narrow(0, offsets_[i], p.local_numel()).view(p.local_shape);
}

void ParamStore::ZeroGrads() {
  if (flat_grads_.defined()) flat_grads_.zero_();
}

absl::Status ParamStore::LoadFromFull(const std::map<std::string, at::Tensor>& full, int r) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamLayout& p = layout_[i];
    auto it = full.find(p.name);
    if (it == full.end()) return absl::InvalidArgumentError("missing tensor " + p.name);
    const at::Tensor& t = it->second;
    if (t.sizes().vec() != p.full_shape) {
      return absl::InvalidArgumentError("tensor " + p.name + " has shape " + c10::str(t.sizes()) +
                                        ", expected " + c10::str(at::IntArrayRef(p.full_shape)));
    }
    at::Tensor src = t.to(at::kFloat);
    at::Tensor local;
    switch (p.kind) {
      case ShardKind::kReplicated:
        local = src;
        break;
      case ShardKind::kRows:
        local = src.narrow(0, p.shard_begin, p.shard_len);
        break;
      case ShardKind::kCols:
        local = src.narrow(1, p.shard_begin, p.shard_len);
        break;
      case ShardKind::kCAttnMqa: {
        const int64_t E = p.full_shape[0] - p.kv_rows;
        local =
            at::cat({src.narrow(0, p.shard_begin, p.shard_len), src.narrow(0, E, p.kv_rows)}, 0);
        break;
      }
    }
    (void)r;
    params_[i].copy_(local);
  }
  SyncComputeParams();
  return absl::OkStatus();
}

std::map<std::string, at::Tensor> InitFullWeights(const ModelConfig& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto layout = BuildTpLayout(m, 1, 0);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double std = m.initializer_range;
  const double proj_std = m.initializer_range / std::sqrt(2.0 * m.n_layer);
  std::map<std::string, at::Tensor> out;
  for (const ParamLayout& p : *layout) {
    at::Tensor t = at::empty(p.full_shape, at::kFloat);
    const auto ends_with = [&](const std::string& s) {
      return p.name.size() >= s.size() &&
             p.name.compare(p.name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || ends_with("ln_f.weight")) {
      t.fill_(1.0);
    } else if (ends_with(".bias")) {
      t.zero_();
    } else if (ends_with("c_proj.weight")) {
      t.normal_(0.0, proj_std, gen);
    } else {
      t.normal_(0.0, std, gen);
    }
    out[p.name] = t;
  }
  return out;
}

std::map<std::string, at::Tensor> AssembleFull(const std::vector<std::vector<ParamLayout>>& layouts,
                                               const std::vector<at::Tensor>& flats) {
  std::map<std::string, at::Tensor> out;
  const size_t tp = layouts.size();
  std::vector<int64_t> off(tp, 0);
  for (size_t i = 0; i < layouts[0].size(); ++i) {
    std::vector<at::Tensor> locals;
    for (size_t r = 0; r < tp; ++r) {
      const ParamLayout& p = layouts[r][i];
      locals.push_back(flats[r].narrow(0, off[r], p.local_numel()).view(p.local_shape));
      off[r] += p.local_numel();
    }
    const ParamLayout& p0 = layouts[0][i];
    at::Tensor full;
    switch (p0.kind) {
      case ShardKind::kReplicated:
        full = locals[0].clone();
        break;
      case ShardKind::kRows:
        full = at::cat(locals, 0);
        break;
      case ShardKind::kCols:
        full = at::cat(locals, 1);
        break;
      case ShardKind::kCAttnMqa: {
        std::vector<at::Tensor> parts;
        for (size_t r = 0; r < tp; ++r) parts.push_back(locals[r].narrow(0, 0, p0.kv_row_begin));
        parts.push_back(locals[0].narrow(0, p0.kv_row_begin, p0.kv_rows));
        full = at::cat(parts, 0);
        break;
      }
    }
    out[p0.name] = full.contiguous();
  }
  return out;
}

}  // namespace latchkey
