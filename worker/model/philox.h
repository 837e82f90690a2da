// Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator torch uses on CUDA) and the dropout streams built on it (docs/model.md,
// "Dropout and the RNG rule"): every dropout mask element is a pure function of
// (seed, stream position of the sample row, layer, dropout site, global head, element position
// within the row's activation), so every layout draws the same masks.
//
// Torch-free and header-light: the model's torch code (dropout_mask.h) and the unit tests use it.
// Everything here is a pure function; thread-safe. Preconditions (checked by dropout_mask.h's
// callers, not here): layer < 2^16, head < 2^14, first_element + elements per (row, head) <= 2^34,
// position >= 0.
#ifndef LATCHKEY_WORKER_MODEL_PHILOX_H_
#define LATCHKEY_WORKER_MODEL_PHILOX_H_

#include <array>
#include <cstdint>

namespace latchkey::philox {

using Counter = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

// The round multipliers and the Weyl key increments of Philox 4x32.
inline constexpr uint32_t kM0 = 0xD2511F53u;
inline constexpr uint32_t kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u;
inline constexpr uint32_t kW1 = 0xBB67AE85u;
inline constexpr int kRounds = 10;

// Philox 4x32 with kRounds rounds: the key is bumped by (kW0, kW1) after every round but the
// last, as Random123's philox4x32_R and torch's at::philox_engine do.
inline Counter Philox4x32(Counter c, Key k) {
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

// The dropout sites, as they appear in counter word 1.
enum class DropoutSite : uint32_t {
  kEmbd = 0,       // after the embeddings: elements t·E + e of the [S, E] row
  kAttn = 1,       // the attention probabilities: elements t·S + j of head h's [S, S] block
  kResidAttn = 2,  // on the attention output before the first residual add ([S, E])
  kResidMlp = 3,   // on the MLP output before the second residual add ([S, E])
};

inline constexpr int64_t kMaxLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxHeads = int64_t{1} << 14;
inline constexpr int64_t kMaxElements = int64_t{1} << 34;  // per (row, head): 2^32 counters x 4

// The key: the seed's low and high 32 bits (torch's philox_engine does the same).
inline Key DropoutKey(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

// Counter word 1: site in bits 0-1, the global head in bits 2-15 (0 for the [S, E] sites),
// the layer in bits 16-31 (0 for kEmbd).
inline uint32_t StreamWord(DropoutSite site, int64_t layer, int64_t head) {
  return static_cast<uint32_t>(site) | static_cast<uint32_t>(head) << 2 |
         static_cast<uint32_t>(layer) << 16;
}

// Element i of a (row, head) is lane i mod 4 of the Philox output for the counter
//   (i / 4, StreamWord(site, layer, head), position mod 2^32, position / 2^32).
// In torch's terms that is at::philox_engine(seed, /*subsequence=*/position,
// /*offset=*/StreamWord << 32 | i / 4), output i mod 4.
inline Counter DropoutCounter(int64_t position, uint32_t stream_word, int64_t element) {
  const uint64_t pos = static_cast<uint64_t>(position);
  return {static_cast<uint32_t>(element >> 2), stream_word, static_cast<uint32_t>(pos),
          static_cast<uint32_t>(pos >> 32)};
}

// The output word's uniform: u = (x >> 8) · 2^-24, exact in float, in [0, 1). The element is kept
// iff u < 1 − p, i.e. iff (x >> 8) < KeepThreshold(p) = ceil((1 − p) · 2^24) (exact: the
// multiplication by 2^24 is exact in double). p <= 0 keeps everything, p >= 1 nothing.
inline uint32_t KeepThreshold(double p) {
  constexpr double kTwo24 = 16777216.0;
  if (!(p > 0.0)) return 1u << 24;
  if (p >= 1.0) return 0;
  const double t = (1.0 - p) * kTwo24;
  const auto floor_t = static_cast<uint32_t>(t);
  return static_cast<double>(floor_t) == t ? floor_t : floor_t + 1;
}
inline bool Keep(uint32_t x, uint32_t threshold) { return (x >> 8) < threshold; }

// One dropout call's draw: `rows` sample rows at the given stream positions, heads
// [first_head, first_head + heads) (first_head 0, heads 1 for the [S, E] sites), `elements`
// mask elements per (row, head), starting at element `first_element` of the (row, head)'s stream
// (0 for a whole activation; a sequence-parallel shard of positions [t0, t0 + S/tp) of an [S, E]
// activation draws elements [t0·E, (t0 + S/tp)·E), the same bits as that slice of the whole).
struct DropoutDraw {
  uint64_t seed = 0;
  DropoutSite site = DropoutSite::kEmbd;
  int64_t layer = 0;
  int64_t first_head = 0;
  int64_t heads = 1;
  int64_t elements = 0;
  int64_t first_element = 0;
  double p = 0.0;
};

// The CPU loop: out[(b·heads + h)·elements + i] = keep of element first_element + i of head
// first_head + h of the row at positions[b], for b < rows. `out` holds rows·heads·elements entries.
void FillKeepMask(const DropoutDraw& draw, const int64_t* positions, int64_t rows, bool* out);

}  // namespace latchkey::philox

#endif  // LATCHKEY_WORKER_MODEL_PHILOX_H_
