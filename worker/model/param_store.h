// The parameters and gradients of one rank's model shard, each in ONE flat fp32 buffer.
//
// Every parameter tensor is a view into `params()` and its .grad a view into `grads()`, so the
// DP reduction, ZeRO-1 partitioning, the norm and the optimizer work on plain contiguous memory,
// and autograd accumulates micro-batch gradients in place (the grads are pre-set views; call
// ZeroGrads(), never reset them to undefined). ZeRO-2 keeps no full gradient across the window:
// its store is built with the gradient buffer detached (ReleaseGrads), attaches it only for the
// micro-batches that accumulate locally (no_sync) and releases it again after the micro-batch
// that reduces it.
// Segments describe which stretches are sharded over TP and which are replicated on every TP
// rank (counted once in the global norm).
// Thread-safety: not thread-safe; owned by the training thread.
#ifndef LATCHKEY_WORKER_MODEL_PARAM_STORE_H_
#define LATCHKEY_WORKER_MODEL_PARAM_STORE_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/tp_layout.h"

namespace latchkey {

class ParamStore {
 public:
  // The flat buffers hold padded_numel() = roundup(numel() + 1, pad_multiple) elements: the
  // tail [numel(), padded_numel()) is zero padding (ZeRO-1 partitions need equal chunks), and
  // element numel() is a spare slot the engine uses to carry the loss in the DP all-reduce.
  // Every flat buffer is allocated on `device`; LoadFromFull copies host tensors onto it.
  ParamStore(std::vector<ParamLayout> layout, int pad_multiple,
             c10::Device device = c10::Device(c10::kCPU), bool attach_grads = true);

  const std::vector<ParamLayout>& layout() const { return layout_; }
  const std::vector<FlatSegment>& segments() const { return segments_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  c10::Device device() const { return device_; }

  at::Tensor& flat_params() { return flat_params_; }
  at::Tensor& flat_grads() { return flat_grads_; }
  // The parameter the model computes with, by HF name: in fp32 mode the leaf viewing
  // flat_params (its .grad views flat_grads); in bf16 mode a bf16 copy (its own leaf, whose
  // gradient the engine folds into the fp32 flat_grads, see compute_grad). Aborts on a name that is
  // not in the layout (a programming error).
  const at::Tensor& param(const std::string& name) const;

  // Mixed precision: bf16 compute parameters (views of one flat bf16 buffer) over fp32 master
  // weights and fp32 gradient accumulation. Call before LoadFromFull.
  void EnableBf16Compute();
  // bf16 mode: the flat bf16 buffer the compute parameters view (padded like the others).
  at::Tensor& flat_compute() { return flat_compute_; }
  // bf16 mode, after LoadFromFull: the fp32 master of [begin, end) is handed to the caller (the
  // engine keeps only its ZeRO partition) and this store drops its full fp32 copy.
  at::Tensor TakeMaster(int64_t begin, int64_t end);
  // The fp32 gradient of parameter i (a view of flat_grads).
  at::Tensor grad_view(size_t i);
  bool bf16() const { return bf16_; }
  // bf16 mode, before TakeMaster: refresh the bf16 copies from the fp32 parameters.
  void SyncComputeParams();
  // bf16 mode: the gradient the last backward left on compute parameter i (undefined before the
  // first backward). The engine folds it into flat_grads and zeroes it.
  at::Tensor& compute_grad(size_t i) { return compute_params_[i].mutable_grad(); }
  const std::vector<at::Tensor>& params() const { return params_; }
  int64_t offset(size_t i) const { return offsets_[i]; }

  void ZeroGrads();  // no-op while the gradient buffer is released

  // The full flat gradient buffer and the fp32 leaves' .grad views of it exist (the default).
  bool grads_attached() const { return flat_grads_.defined(); }
  // Allocates a zeroed flat gradient buffer and points the fp32 leaves' .grad at it; no-op when
  // attached.
  void AttachGrads();
  // Frees the flat gradient buffer and leaves every fp32 leaf's .grad undefined.
  void ReleaseGrads();

  // Copies this rank's shard of every parameter out of full (unsharded) fp32 tensors.
  // INVALID_ARGUMENT naming the tensor when one is missing or has the wrong shape.
  absl::Status LoadFromFull(const std::map<std::string, at::Tensor>& full, int tp_rank);

 private:
  std::vector<ParamLayout> layout_;
  std::vector<FlatSegment> segments_;
  std::vector<int64_t> offsets_;
  std::map<std::string, size_t> index_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  c10::Device device_;
  at::Tensor flat_params_;
  at::Tensor flat_grads_;
  std::vector<at::Tensor> params_;
  bool bf16_ = false;
  std::vector<at::Tensor> compute_params_;  // bf16 leaves viewing flat_compute_ (bf16 mode)
  at::Tensor flat_compute_;
};

// HF initialisation of the FULL model from a seed (identical on every rank): Linear weights and
// embeddings N(0, initializer_range), both c_proj weights N(0, initializer_range/sqrt(2 n_layer)),
// biases 0, LayerNorm weight 1 / bias 0.
std::map<std::string, at::Tensor> InitFullWeights(const ModelConfig& model, uint64_t seed);

// Reassembles full tensors from the flat parameter buffers of every TP rank (index = tp_rank),
// all laid out as `layouts[r]`.
std::map<std::string, at::Tensor> AssembleFull(const std::vector<std::vector<ParamLayout>>& layouts,
                                               const std::vector<at::Tensor>& flats);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_PARAM_STORE_H_
