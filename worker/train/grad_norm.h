// The exact global gradient norm over a sharded model: rows sharded over TP are summed over TP,
// rows replicated on every TP rank (K/V rows after the reduction, LayerNorms, embeddings,
// row-parallel biases) are counted once (by TP rank 0), then over DP partitions for ZeRO-1 and 2.
// Accumulates in fp64, segment by segment in layout order (FlatOps::SumSquares).
#ifndef LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_
#define LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "worker/model/tp_layout.h"
#include "worker/train/flat_ops.h"

namespace latchkey {

// The stretches of flat range [begin, end) that this rank counts: every sharded segment, and
// replicated ones only when `count_replicated` (true on TP rank 0); each clipped to the range,
// in segment order, empty ones left out.
std::vector<FlatRange> NormRanges(const std::vector<FlatSegment>& segments, int64_t begin,
                                  int64_t end, bool count_replicated);

// This rank's share of the squared norm of the flat gradient buffer `grads` over [begin, end).
double LocalGradNormSq(const FlatOps& ops, const at::Tensor& grads,
                       const std::vector<FlatSegment>& segments, int64_t begin, int64_t end,
                       bool count_replicated);

// The same share for a buffer that holds only [begin, end) of the flat layout (ZeRO-2's
// gradient partition: element 0 of `part` is flat element `begin`): the same ranges in the same
// order, so the same sum as LocalGradNormSq over a full buffer with those values.
double PartitionGradNormSq(const FlatOps& ops, const at::Tensor& part,
                           const std::vector<FlatSegment>& segments, int64_t begin, int64_t end,
                           bool count_replicated);

// DeepSpeed's clip coefficient: max / (norm + 1e-6), applied only when below 1. Returns 1 when
// clipping is off (max <= 0) or not needed.
double ClipCoefficient(double norm, double max_norm);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_
