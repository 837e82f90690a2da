// The activation bytes per transformer layer of Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", section 4), written per term so that it can be
// evaluated in a run's own element sizes (docs/memory.md derives it). The paper's
// sbh(10 + 24/t + 5as/(ht)) is this with 2-byte activations, 1-byte masks and dropout on.
// bench/memory.cc prints it next to the measured bytes; the end-to-end test checks the measured
// growth with seq_len against it. Header-only, torch-free; pure functions.
#ifndef LATCHKEY_WORKER_MEMORY_ACTIVATION_FORMULA_H_
#define LATCHKEY_WORKER_MEMORY_ACTIVATION_FORMULA_H_

#include <cstdint>

namespace latchkey::memory {

struct FormulaShape {
  double s = 0;                 // sequence length
  double b = 0;                 // micro-batch size
  double h = 0;                 // hidden size (n_embd)
  double a = 0;                 // attention heads
  double t = 1;                 // tensor-parallel size
  double activation_bytes = 4;  // element size of the stored activations (fp32: 4)
  double mask_bytes = 1;        // element size of a stored dropout mask (latchkey: bool, 1)
  bool dropout = false;         // any dropout probability > 0 (masks are stored only then)
};

enum class FormulaMode { kNone, kSelective, kFull };

// Bytes per layer. Terms (e = activation_bytes, m = mask_bytes, d = 1 with dropout else 0):
//   replicated over TP: the two LayerNorm inputs and the two column-parallel inputs (their
//     outputs) 4e sbh, the two residual dropout masks 2dm sbh;
//   sharded over TP: Q, K, V 3e sbh, the attention output projection's input e sbh, the GeLU
//     input and output 8e sbh: 12e sbh / t;
//   core attention, sharded over TP: softmax output e as²b, with dropout its mask m as²b and
//     its output e as²b: (e + d(e + m)) as²b / t.
// Sequence parallelism divides the replicated terms by t; selective recomputation drops the
// core-attention term; full recomputation keeps only the layer input, e sbh (/ t under SP).
inline double ActivationBytesPerLayer(const FormulaShape& f, FormulaMode mode, bool sp) {
  const double e = f.activation_bytes, m = f.mask_bytes, d = f.dropout ? 1.0 : 0.0;
  const double sbh = f.s * f.b * f.h;
  if (mode == FormulaMode::kFull) return sp ? e * sbh / f.t : e * sbh;
  const double replicated = (4 * e + 2 * d * m) * sbh;
  const double sharded = 12 * e * sbh / f.t;
  const double attention = (e + d * (e + m)) * f.a * f.s * f.s * f.b / f.t;
  return (sp ? replicated / f.t : replicated) + sharded +
         (mode == FormulaMode::kSelective ? 0.0 : attention);
}

// Bytes the forward keeps outside the layers, for the model's vocabulary `vocab`: the final
// LayerNorm's input and output (the logits matmul's input) 2e sbh and the log-softmax output the
// cross entropy keeps, e sbV (the embedding sum is not kept; its indices are the batch's).
inline double OutsideLayersBytes(const FormulaShape& f, double vocab) {
  return f.activation_bytes * f.s * f.b * (2 * f.h + vocab);
}

}  // namespace latchkey::memory

#endif  // LATCHKEY_WORKER_MEMORY_ACTIVATION_FORMULA_H_
