#include "worker/model/gpt_bigcode.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "worker/comm/collective_error.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/dropout_mask.h"
#include "worker/model/recompute.h"

namespace latchkey {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

comm::Group* GroupFrom(AutogradContext* ctx) {
  return reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
}

// Sums a contiguous tensor over the group in place; bf16 activations travel (and sum) in fp32.
// Runs inside autograd (forward and backward), where no Status can be returned: a failed
// collective is thrown as a CollectiveError carrying its Status (code included), which autograd
// passes through to the caller of backward() unchanged.
void AllReduceInPlace(comm::Group* g, at::Tensor& t, const char* tag = nullptr) {
  at::Tensor buf = t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
  comm::CollectiveOptions opts;
  opts.tag = tag;
  if (absl::Status st = g->AllReduceSum(CommBuffer(buf), opts); !st.ok()) {
    throw comm::CollectiveError(std::move(st));
  }
  if (!buf.is_same(t)) t.copy_(buf);
}

// Megatron's "f": identity forward, all-reduce of the input gradient backward.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Reduced in place: the incoming gradient is the column-parallel matmul's input gradient, a
    // tensor made for this edge alone (contiguous() copies only when it is not contiguous).
    at::Tensor g = grads[0].contiguous();
    AllReduceInPlace(GroupFrom(ctx), g);
    return {g, at::Tensor()};
  }
};

// Megatron's "g": all-reduce forward (counted under `tag` when set), identity backward.
struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* g,
                            const char* tag) {
    // x is the row-parallel matmul's fresh output, which nothing saved for backward: reduce it in
    // place (marked dirty, so autograd moves its history here) unless it is a view or not
    // contiguous, when a copy is reduced instead.
    at::Tensor out = x;
    if (x.is_contiguous() && !x.is_view()) {
      ctx->mark_dirty({x});
    } else {
      out = x.contiguous().clone();
    }
    AllReduceInPlace(g, out, tag);
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

void ThrowIfFailed(absl::Status st) {
  if (!st.ok()) throw comm::CollectiveError(std::move(st));
}

// Sequence parallelism moves activations [B, s, ...] whose dim 1 (the sequence) is split over
// the group in blocks of s = S/t positions, rank r holding [r·s, (r+1)·s). The collectives work on
// flat buffers concatenated rank after rank, i.e. along dim 0, so each of these makes one copy
// to or from the rank-major layout [t, B, s, ...] (a view instead when B = 1). bf16 activations
// travel (and sum) in fp32, like the all-reduces.

// [B, s, ...] on every rank -> [B, t·s, ...]: one copy into the gather (the group copies `in`
// into its chunk of `out`) and one permute copy of the result when B > 1.
at::Tensor SeqAllGather(comm::Group* g, const at::Tensor& x, const char* tag) {
  const at::Tensor in = x.to(at::kFloat).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape.insert(shape.begin(), g->size());
  at::Tensor out = at::empty(shape, in.options());
  comm::CollectiveOptions opts;
  opts.tag = tag;
  ThrowIfFailed(g->AllGather(CommBuffer(in), CommBuffer(out), opts));
  std::vector<int64_t> full = x.sizes().vec();
  full[1] *= g->size();
  return out.transpose(0, 1).reshape(full).to(x.scalar_type());
}

// [B, t·s, ...] -> [B, s, ...]: block rank() of the sum over the group. `y` must be a tensor
// nothing else reads afterwards (a fresh matmul output or gradient): when B = 1 its memory is the
// collective's input itself, which a backend may use as scratch.
at::Tensor SeqReduceScatter(comm::Group* g, const at::Tensor& y, const char* tag) {
  const int64_t t = g->size();
  std::vector<int64_t> blocks = y.sizes().vec();
  blocks[1] /= t;
  blocks.insert(blocks.begin() + 1, t);  // [B, t, s, ...]
  const at::Tensor in = y.to(at::kFloat).reshape(blocks).transpose(0, 1).contiguous();
  std::vector<int64_t> local = y.sizes().vec();
  local[1] /= t;
  at::Tensor out = at::empty(local, in.options());
  comm::CollectiveOptions opts;
  opts.tag = tag;
  ThrowIfFailed(g->ReduceScatterSum(CommBuffer(in), CommBuffer(out), opts));
  return out.to(y.scalar_type());
}

// This rank's block of positions of [B, t·s, ...] (a copy: the shard is the activation kept).
at::Tensor SeqSplit(comm::Group* g, const at::Tensor& x) {
  const int64_t s = x.size(1) / g->size();
  return x.narrow(1, g->rank() * s, s).contiguous();
}

// Megatron-Core's scatter_to_sequence_parallel_region, after the embeddings (computed whole on
// every rank): this rank's positions forward, all-gather of the gradient backward, so the
// embeddings' gradients stay complete on every rank.
struct ScatterToSeq : public torch::autograd::Function<ScatterToSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return SeqSplit(g, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SeqAllGather(GroupFrom(ctx), grads[0], nullptr), at::Tensor()};
  }
};

// After ln_f: the all-gather of the hidden states before the logits (counted under `tag`), and
// this rank's block of the gradient backward. The logits and the loss are computed whole and
// identically on every rank, so that gradient is already complete: no reduction.
struct GatherFromSeq : public torch::autograd::Function<GatherFromSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* g,
                            const char* tag) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return SeqAllGather(g, x, tag);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SeqSplit(GroupFrom(ctx), grads[0]), at::Tensor(), at::Tensor()};
  }
};

// A column-parallel matmul (c_attn, c_fc) under sequence parallelism, as Megatron-Core's
// LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel: forward all-gathers the
// [B, s, in] input along the sequence (counted under `tag`) and computes x·Wᵀ + b on all S
// positions; it saves only the rank's [B, s, in] shard, so backward all-gathers it again for the
// weight gradient (Korthikanti et al. 2022, 4.2.2: one more all-gather instead of keeping t
// times the input) and reduce-scatters the input gradient along the sequence.
struct ColumnLinearSeq : public torch::autograd::Function<ColumnLinearSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b, comm::Group* g, const char* tag) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->save_for_backward({x, w});
    return at::linear(SeqAllGather(g, x, tag), w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Group* g = GroupFrom(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[1];
    const at::Tensor gy = grads[0].contiguous();
    const at::Tensor x_full = SeqAllGather(g, saved[0], nullptr);
    const int64_t out = w.size(0), in = w.size(1);
    const at::Tensor gy2 = gy.view({-1, out});
    at::Tensor gw = gy2.t().mm(x_full.reshape({-1, in}));
    at::Tensor gb = gy2.sum(0);
    at::Tensor gx = SeqReduceScatter(g, at::matmul(gy, w), nullptr);
    return {gx, gw, gb, at::Tensor(), at::Tensor()};
  }
};

// After a row-parallel matmul (attn.c_proj, mlp.c_proj) under sequence parallelism: the
// reduce-scatter of the partial sums along the sequence (counted under `tag`) instead of the
// all-reduce, and the all-gather of the gradient backward.
struct ReduceScatterFromTp : public torch::autograd::Function<ReduceScatterFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, comm::Group* g,
                            const char* tag) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return SeqReduceScatter(g, y, tag);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SeqAllGather(GroupFrom(ctx), grads[0], nullptr), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

GptBigCode::GptBigCode(const ModelConfig& config, ParamStore* store, comm::Group* tp_group,
                       uint64_t dropout_seed, bool sequence_parallel)
    : cfg_(config),
      store_(store),
      tp_(tp_group),
      sp_(sequence_parallel && comm::is_parallel(tp_group)),
      local_heads_(config.n_head / (tp_group ? tp_group->size() : 1)),
      first_head_((tp_group ? tp_group->rank() : 0) * local_heads_),
      dropout_seed_(dropout_seed) {}

at::Tensor GptBigCode::Dropout(const at::Tensor& x, double p, philox::DropoutSite site,
                               int64_t layer) {
  if (!training_ || p <= 0.0) return x;
  philox::DropoutDraw d;
  d.seed = dropout_seed_;
  d.site = site;
  d.layer = layer;
  const int64_t rows = x.size(0);
  if (site == philox::DropoutSite::kAttn) {
    // [B, Hl, S, S]: this rank's heads under their global indices, so that every TP degree
    // draws the same mask for the same head.
    d.first_head = first_head_;
    d.heads = x.size(1);
    d.elements = x.numel() / (rows * d.heads);
  } else {
    // [B, S, E], replicated over the TP group: every TP rank draws the same mask. Under
    // sequence parallelism x is this rank's [B, S/tp, E] block of positions, whose mask is the
    // same slice of the whole row's: elements [r·(S/tp)·E, (r+1)·(S/tp)·E) of the stream.
    d.elements = x.numel() / rows;
    if (sp_) d.first_element = tp_->rank() * d.elements;
  }
  d.p = p;
  // Drawn where x lives (the CPU loop, or tensor ops on the device).
  const at::Tensor keep = DropoutKeepMask(d, positions_).view(x.sizes());
  return x * keep / (1.0 - p);
}

bool GptBigCode::Recomputing(RecomputeMode mode) const {
  return recompute_.mode == mode && training_ && at::GradMode::is_enabled();
}

GptBigCode::ReplayScope::ReplayScope(GptBigCode* model, at::Tensor positions)
    : model_(model),
      positions_(std::exchange(model->positions_, std::move(positions))),
      training_(std::exchange(model->training_, true)) {}

GptBigCode::ReplayScope::~ReplayScope() {
  model_->positions_ = std::move(positions_);
  model_->training_ = training_;
}

const at::Tensor& GptBigCode::future_mask(int64_t S) {
  if (!mask_.defined() || mask_.size(0) != S) {
    mask_ = at::ones({S, S}, at::TensorOptions().dtype(at::kBool).device(store_->device()))
                .triu(/*diagonal=*/1);
  }
  return mask_;
}

at::Tensor GptBigCode::Attention(const at::Tensor& qkv, int64_t B, int64_t S, int64_t layer) {
  const int64_t D = cfg_.head_dim();
  const int64_t Hl = local_heads_;
  at::Tensor q, k, v;
  if (cfg_.multi_query) {
    // [B,S,Hl*D | D | D]: one K/V head shared by every query head.
    q = qkv.narrow(-1, 0, Hl * D).view({B, S, Hl, D}).transpose(1, 2);  // [B,Hl,S,D]
    k = qkv.narrow(-1, Hl * D, D).unsqueeze(1);                         // [B,1,S,D]
    v = qkv.narrow(-1, Hl * D + D, D).unsqueeze(1);
  } else {
    at::Tensor blocks = qkv.view({B, S, Hl, 3 * D}).transpose(1, 2);  // [B,Hl,S,3D]
    q = blocks.narrow(-1, 0, D);
    k = blocks.narrow(-1, D, D);
    v = blocks.narrow(-1, 2 * D, D);
  }
  at::Tensor core;
  if (Recomputing(RecomputeMode::kSelective)) {
    // Only q, k, v (views of qkv) are kept; scores, probabilities and the attention dropout mask
    // ([B, Hl, S, S] each) are made again in backward.
    core = Recompute(
        [this, layer, positions = positions_](const std::vector<at::Tensor>& in) {
          ReplayScope scope(this, positions);
          return std::vector<at::Tensor>{CoreAttention(in[0], in[1], in[2], layer)};
        },
        {q, k, v})[0];
  } else {
    core = CoreAttention(q, k, v, layer);
  }
  return core.transpose(1, 2).reshape({B, S, Hl * D});
}

at::Tensor GptBigCode::CoreAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     int64_t layer) {
  const int64_t S = q.size(2), D = q.size(3);
  const double scale = cfg_.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  // On cuda in bf16 without attention dropout: the fused scaled-dot-product attention (flash or
  // memory-efficient kernels). The CPU and fp32 paths keep the explicit form below.
  if (q.is_cuda() && q.scalar_type() == at::kBFloat16 && cfg_.attn_pdrop == 0.0) {
    const int64_t B = q.size(0), Hl = q.size(1);
    return at::scaled_dot_product_attention(q, k.expand({B, Hl, S, D}), v.expand({B, Hl, S, D}), {},
                                            0.0, /*is_causal=*/true, scale);
  }
#endif
  // The scaled scores are a fresh fp32 tensor that nothing saved for backward: masked in place.
  at::Tensor scores = (at::matmul(q, k.transpose(-1, -2)) * scale).to(at::kFloat);  // [B,Hl,S,S]
  scores.masked_fill_(future_mask(S), -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  probs = Dropout(probs, cfg_.attn_pdrop, philox::DropoutSite::kAttn, layer);
  return at::matmul(probs, v);  // [B,Hl,S,D]
}

at::Tensor GptBigCode::Layer(const at::Tensor& x_in, int64_t i) {
  // Under sequence parallelism x_in is this rank's [B, S/tp, E] block of positions; LayerNorm,
  // the biases, dropout and the residual adds work on it, attention and the MLP on all S.
  const int64_t B = x_in.size(0), S = x_in.size(1) * (sp_ ? tp_->size() : 1);
  const int64_t E = cfg_.n_embd;
  const double eps = cfg_.layer_norm_epsilon;
  const bool tp = comm::is_parallel(tp_);
  const auto& P = [&](const std::string& n) -> const at::Tensor& { return store_->param(n); };
  // Column-parallel: f then the matmul, or under SP the all-gathered input's matmul.
  const auto column = [&](at::Tensor x, const std::string& w, const std::string& b) {
    if (sp_) return ColumnLinearSeq::apply(x, P(w), P(b), tp_, tag_);
    if (tp) x = CopyToTp::apply(x, tp_);
    return at::linear(x, P(w), P(b));
  };
  // Row-parallel output: g (the all-reduce), or under SP the reduce-scatter along the sequence.
  const auto reduce = [&](const at::Tensor& y) {
    if (sp_) return ReduceScatterFromTp::apply(y, tp_, tag_);
    return tp ? ReduceFromTp::apply(y, tp_, tag_) : y;
  };
  const std::string pre = "transformer.h." + std::to_string(i) + ".";
  at::Tensor h = at::layer_norm(x_in, {E}, P(pre + "ln_1.weight"), P(pre + "ln_1.bias"), eps);
  at::Tensor qkv = column(h, pre + "attn.c_attn.weight", pre + "attn.c_attn.bias");
  at::Tensor a = at::linear(Attention(qkv, B, S, i), P(pre + "attn.c_proj.weight"));
  a = reduce(a);
  a = a + P(pre + "attn.c_proj.bias");
  at::Tensor x = x_in + Dropout(a, cfg_.resid_pdrop, philox::DropoutSite::kResidAttn, i);

  at::Tensor h2 = at::layer_norm(x, {E}, P(pre + "ln_2.weight"), P(pre + "ln_2.bias"), eps);
  at::Tensor f = at::gelu(column(h2, pre + "mlp.c_fc.weight", pre + "mlp.c_fc.bias"), "tanh");
  at::Tensor m = at::linear(f, P(pre + "mlp.c_proj.weight"));
  m = reduce(m);
  m = m + P(pre + "mlp.c_proj.bias");
  return x + Dropout(m, cfg_.resid_pdrop, philox::DropoutSite::kResidMlp, i);
}

at::Tensor GptBigCode::Logits(const at::Tensor& ids, const std::vector<int64_t>& row_positions) {
  const int64_t B = ids.size(0), S = ids.size(1);
  TORCH_CHECK(!sp_ || S % tp_->size() == 0, "tensor_parallel.sequence_parallel: seq_len ", S,
              " is not divisible by the TP size ", tp_->size());
  TORCH_CHECK(static_cast<int64_t>(row_positions.size()) == B, "GptBigCode: ", row_positions.size(),
              " row positions for a batch of ", B, " rows");
  for (int64_t p : row_positions) {
    TORCH_CHECK(p >= 0, "GptBigCode: row position ", p, " is negative");
  }
  const bool dropout =
      training_ && (cfg_.embd_pdrop > 0 || cfg_.resid_pdrop > 0 || cfg_.attn_pdrop > 0);
  // One copy of B positions per forward (on the device; the masks themselves are drawn there).
  positions_ = dropout ? at::tensor(row_positions, at::kLong).to(store_->device()) : at::Tensor();
  const int64_t E = cfg_.n_embd;
  const double eps = cfg_.layer_norm_epsilon;
  const auto& P = [&](const std::string& n) -> const at::Tensor& { return store_->param(n); };

  at::Tensor pos = at::arange(S, ids.options().dtype(at::kLong));
  at::Tensor x = at::embedding(P("transformer.wte.weight"), ids) +
                 at::embedding(P("transformer.wpe.weight"), pos).unsqueeze(0);
  // Sequence parallelism: from here to ln_f each rank keeps its S/tp positions.
  if (sp_) x = ScatterToSeq::apply(x, tp_);
  x = Dropout(x, cfg_.embd_pdrop, philox::DropoutSite::kEmbd, 0);
  if (Recomputing(RecomputeMode::kFull)) {
    // Only each group's input is kept; the group runs again in backward (its 2 forward TP
    // all-reduces per layer with it).
    for (int first = 0; first < cfg_.n_layer; first += recompute_.every_layers) {
      const int end = std::min(first + recompute_.every_layers, cfg_.n_layer);
      x = Recompute(
          [this, first, end, positions = positions_](const std::vector<at::Tensor>& in) {
            ReplayScope scope(this, positions);
            at::Tensor y = in[0];
            for (int i = first; i < end; ++i) y = Layer(y, i);
            return std::vector<at::Tensor>{y};
          },
          {x})[0];
    }
  } else {
    for (int i = 0; i < cfg_.n_layer; ++i) x = Layer(x, i);
  }
  x = at::layer_norm(x, {E}, P("transformer.ln_f.weight"), P("transformer.ln_f.bias"), eps);
  if (sp_) x = GatherFromSeq::apply(x, tp_, tag_);
  return at::matmul(x, P("transformer.wte.weight").t());
}

at::Tensor GptBigCode::Loss(const at::Tensor& ids, const at::Tensor& labels,
                            const std::vector<int64_t>& row_positions) {
  at::Tensor logits = Logits(ids, row_positions);
  return at::cross_entropy_loss(logits.reshape({-1, cfg_.vocab_size}).to(at::kFloat),
                                labels.reshape({-1}));
}

}  // namespace latchkey
