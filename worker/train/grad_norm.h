// The exact global gradient norm over a sharded model: rows sharded over TP are summed over TP,
// rows replicated on every TP rank (K/V rows after the reduction, LayerNorms, embeddings,
// row-parallel biases) are counted once (by TP rank 0), then over DP partitions for ZeRO-1.
// Accumulates in fp64.
#ifndef LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_
#define LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_

#include <vector>

#include "worker/model/tp_layout.h"

namespace latchkey {

// This rank's share of the squared norm over flat range [begin, end): every sharded element, and
// replicated elements only when `count_replicated` (true on TP rank 0).
double LocalGradNormSq(const float* grads, const std::vector<FlatSegment>& segments, int64_t begin,
                       int64_t end, bool count_replicated);

// DeepSpeed's clip coefficient: max / (norm + 1e-6), applied only when below 1. Returns 1 when
// clipping is off (max <= 0) or not needed.
double ClipCoefficient(double norm, double max_norm);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_GRAD_NORM_H_
