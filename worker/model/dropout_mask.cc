#include "worker/model/dropout_mask.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>

namespace latchkey {
namespace {

constexpr int64_t kLow32 = 0xFFFFFFFFLL;
constexpr int64_t kLow16 = 0xFFFFLL;

void CheckDraw(const philox::DropoutDraw& d, const at::Tensor& positions) {
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong,
              "dropout: row positions must be an int64 vector, got ", positions.sizes(), " ",
              positions.scalar_type());
  TORCH_CHECK(d.layer >= 0 && d.layer < philox::kMaxLayers, "model.n_layer: dropout streams have ",
              philox::kMaxLayers, " layers, layer ", d.layer, " is outside them");
  TORCH_CHECK(d.first_head >= 0 && d.heads >= 1 && d.first_head + d.heads <= philox::kMaxHeads,
              "model.n_head: dropout streams have ", philox::kMaxHeads, " heads, heads [",
              d.first_head, ", ", d.first_head + d.heads, ") are outside them");
  TORCH_CHECK(d.elements >= 0 && d.first_element >= 0 &&
                  d.first_element + d.elements <= philox::kMaxElements,
              "latchkey.seq_len: a dropout mask of elements [", d.first_element, ", ",
              d.first_element + d.elements, ") per row and head exceeds the streams' ",
              philox::kMaxElements);
}

// a·m as two 32-bit words (hi, lo), for a in [0, 2^32) (int64) and the constant m < 2^32. The
// 64-bit product would overflow int64, so m is split at bit 16: both partial products stay below
// 2^48, and t = a·m_lo + ((a·m_hi) mod 2^16)·2^16 below 2^49; then
// a·m = (a·m_hi >> 16)·2^32 + t, so hi = (a·m_hi >> 16) + (t >> 32) and lo = t mod 2^32.
std::array<at::Tensor, 2> MulHiLo(const at::Tensor& a, uint32_t m) {
  const int64_t m_hi = m >> 16;
  const int64_t m_lo = m & kLow16;
  const at::Tensor p_hi = a * m_hi;
  const at::Tensor t = a * m_lo + at::bitwise_left_shift(at::bitwise_and(p_hi, kLow16), 16);
  return {at::bitwise_right_shift(p_hi, 16) + at::bitwise_right_shift(t, 32),
          at::bitwise_and(t, kLow32)};
}

// Philox4x32-10 on int64 tensors holding 32-bit words; the words broadcast against each other,
// so c0 [1,1,G], c1 [1,H,1], c2/c3 [R,1,1] give outputs broadcast to [R,H,G].
std::array<at::Tensor, 4> PhiloxTensors(std::array<at::Tensor, 4> c, philox::Key k) {
  for (int r = 0; r < philox::kRounds; ++r) {
    auto [hi0, lo0] = MulHiLo(c[0], philox::kM0);
    auto [hi1, lo1] = MulHiLo(c[2], philox::kM1);
    c = {at::bitwise_xor(at::bitwise_xor(hi1, c[1]), static_cast<int64_t>(k[0])), lo1,
         at::bitwise_xor(at::bitwise_xor(hi0, c[3]), static_cast<int64_t>(k[1])), lo0};
    k[0] += philox::kW0;  // uint32 arithmetic: wraps as the key schedule requires
    k[1] += philox::kW1;
  }
  return c;
}

}  // namespace

at::Tensor DropoutKeepMaskTensorOps(const philox::DropoutDraw& d, const at::Tensor& positions,
                                    int64_t chunk_entries) {
  CheckDraw(d, positions);
  const auto opts = positions.options();
  const int64_t rows = positions.size(0);
  // Counters [first_group, first_group + groups) cover elements [first_element, + elements).
  const int64_t first_group = d.first_element >> 2;
  const int64_t lead = d.first_element & 3;  // lanes of the first counter before first_element
  const int64_t groups = (lead + d.elements + 3) / 4;  // counters per (row, head)
  const int64_t threshold = philox::KeepThreshold(d.p);
  const philox::Key key = philox::DropoutKey(d.seed);
  // Counter words 0 and 1 do not depend on the row: built once, on the device.
  const at::Tensor c0 = at::arange(first_group, first_group + groups, opts).view({1, 1, groups});
  const int64_t base_word = static_cast<int64_t>(philox::StreamWord(d.site, d.layer, 0));
  const at::Tensor c1 = (at::arange(d.first_head, d.first_head + d.heads, opts) * 4 + base_word)
                            .view({1, d.heads, 1});
  // Rows in chunks, which bounds the int64 intermediates (about 20 live tensors of a chunk's
  // counters each at the peak of a round).
  const int64_t per_row = std::max<int64_t>(1, d.heads * groups);
  const int64_t chunk = std::max<int64_t>(1, chunk_entries / per_row);
  std::vector<at::Tensor> parts;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const at::Tensor pos = positions.narrow(0, r0, n).view({n, 1, 1});
    const std::array<at::Tensor, 4> x = PhiloxTensors(
        {c0, c1, at::bitwise_and(pos, kLow32), at::bitwise_right_shift(pos, 32)}, key);
    std::vector<at::Tensor> lanes;
    for (const at::Tensor& w : x) {
      lanes.push_back((at::bitwise_right_shift(w, 8) < threshold).expand({n, d.heads, groups}));
    }
    // Lane l of counter g is element 4g + l.
    parts.push_back(
        at::stack(lanes, -1).reshape({n, d.heads, groups * 4}).narrow(2, lead, d.elements));
  }
  if (parts.empty()) return at::empty({0, d.heads, d.elements}, opts.dtype(at::kBool));
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, 0);
}

at::Tensor DropoutKeepMask(const philox::DropoutDraw& d, const at::Tensor& positions) {
  if (!positions.is_cpu()) return DropoutKeepMaskTensorOps(d, positions);
  CheckDraw(d, positions);
  const at::Tensor pos = positions.contiguous();
  const int64_t rows = pos.size(0);
  at::Tensor out = at::empty({rows, d.heads, d.elements}, pos.options().dtype(at::kBool));
  // Rows in parallel over the intra-op threads: every element is a function of its own
  // coordinates, so the split cannot change a bit.
  const int64_t* p = pos.data_ptr<int64_t>();
  bool* o = out.data_ptr<bool>();
  const int64_t per_row = d.heads * d.elements;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    philox::FillKeepMask(d, p + begin, end - begin, o + begin * per_row);
  });
  return out;
}

}  // namespace latchkey
