// The Philox 4x32-10 generator and the dropout streams (worker/model/philox.h, dropout_mask.h):
// Random123's known answers, torch's own Philox engine, the tensor-op path against the CPU loop
// bit for bit, and the mapping's properties (a mask is a function of the row's position, the
// global head and the element, never of the batch it is drawn in).
#include "worker/model/philox.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "worker/model/dropout_mask.h"

namespace latchkey {
namespace {

using philox::Counter;
using philox::DropoutDraw;
using philox::DropoutSite;
using philox::Key;

// Random123 1.14, tests/kat_vectors (D. E. Shaw Research), the three "philox4x32 10" lines:
//   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000
//                 6627e8d5 e169c58d bc57ac4c 9b00dbd8
//   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff
//                 408f276d 41c83b0e a20bc7c6 6d5451fd
//   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0
//                 d16cfe09 94fdcceb 5001e420 24126ea1
// Columns: the counter (4 words), the key (2 words), the expected output (4 words).
TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    Counter ctr;
    Key key;
    Counter want;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(philox::Philox4x32(k.ctr, k.key), k.want);
}

// The stream of (seed, position) is torch's at::philox_engine(seed, subsequence = position,
// offset = stream word << 32 | element / 4), output element mod 4.
TEST(Philox, MappingIsTorchsPhiloxEngine) {
  for (uint64_t seed : {uint64_t{1}, uint64_t{0xDEADBEEFCAFEF00D}}) {
    for (int64_t position : {int64_t{0}, int64_t{7}, (int64_t{1} << 32) + 5}) {
      const uint32_t word = philox::StreamWord(DropoutSite::kAttn, 3, 5);
      for (int64_t group : {0, 1, 1000}) {
        at::philox_engine torch_engine(seed, static_cast<uint64_t>(position),
                                       (static_cast<uint64_t>(word) << 32) | group);
        const Counter mine = philox::Philox4x32(philox::DropoutCounter(position, word, 4 * group),
                                                philox::DropoutKey(seed));
        for (int lane = 0; lane < 4; ++lane) EXPECT_EQ(torch_engine(), mine[lane]);
      }
    }
  }
}

TEST(Philox, StreamWordFields) {
  EXPECT_EQ(philox::StreamWord(DropoutSite::kEmbd, 0, 0), 0u);
  EXPECT_EQ(philox::StreamWord(DropoutSite::kResidMlp, 0, 0), 3u);
  EXPECT_EQ(philox::StreamWord(DropoutSite::kAttn, 2, 5), 1u | 5u << 2 | 2u << 16);
  EXPECT_EQ(philox::StreamWord(DropoutSite::kAttn, philox::kMaxLayers - 1, philox::kMaxHeads - 1),
            0xFFFFFFFDu);
}

// keep iff u < 1 - p with u = (x >> 8) * 2^-24, evaluated in double, for the threshold form.
TEST(Philox, KeepIsUniformBelowOneMinusP) {
  EXPECT_EQ(philox::KeepThreshold(0.0), 1u << 24);
  EXPECT_EQ(philox::KeepThreshold(0.5), 1u << 23);
  EXPECT_EQ(philox::KeepThreshold(0.1), 15099495u);  // ceil(0.9 * 2^24 = 15099494.4)
  EXPECT_EQ(philox::KeepThreshold(1.0), 0u);
  for (double p : {0.1, 0.25, 0.5, 0.9, 1e-7}) {
    const uint32_t t = philox::KeepThreshold(p);
    for (uint32_t k : {t - 2, t - 1, t, t + 1, 0u, (1u << 24) - 1}) {
      for (uint32_t low : {0u, 255u}) {
        const uint32_t x = k << 8 | low;
        const double u = static_cast<double>(x >> 8) * std::ldexp(1.0, -24);
        EXPECT_EQ(philox::Keep(x, t), u < 1.0 - p) << "p " << p << " x " << x;
      }
    }
  }
}

at::Tensor Positions(const std::vector<int64_t>& p) { return at::tensor(p, at::kLong); }

at::Tensor CpuLoop(const DropoutDraw& d, const std::vector<int64_t>& positions) {
  return DropoutKeepMask(d, Positions(positions));
}

TEST(DropoutMask, TensorOpsEqualTheCpuLoopBitForBit) {
  const std::vector<int64_t> positions = {0,
                                          1,
                                          12345,
                                          (int64_t{1} << 32) - 1,
                                          (int64_t{1} << 32) + 5,
                                          int64_t{1} << 40,
                                          (int64_t{1} << 62) + 3};
  struct Case {
    DropoutSite site;
    int64_t layer, first_head, heads, elements;
    double p;
    uint64_t seed;
  };
  const Case cases[] = {
      {DropoutSite::kEmbd, 0, 0, 1, 32 * 64, 0.1, 1},
      {DropoutSite::kResidAttn, 1, 0, 1, 37, 0.5, 0xFFFFFFFFFFFFFFFFULL},  // a tail of 1 lane
      {DropoutSite::kResidMlp, 65535, 0, 1, 3, 0.9, 0x123456789ULL},
      {DropoutSite::kAttn, 7, 3, 5, 16 * 16, 0.1, 42},
      {DropoutSite::kAttn, 0, 16383, 1, 1, 0.3, 0},
  };
  for (const Case& c : cases) {
    DropoutDraw d;
    d.seed = c.seed;
    d.site = c.site;
    d.layer = c.layer;
    d.first_head = c.first_head;
    d.heads = c.heads;
    d.elements = c.elements;
    d.p = c.p;
    const at::Tensor loop = CpuLoop(d, positions);
    ASSERT_EQ(loop.sizes(), (std::vector<int64_t>{7, c.heads, c.elements}));
    // One chunk, and chunks of one and of two rows.
    for (int64_t chunk : {int64_t{1} << 24, int64_t{1}, 2 * c.heads * ((c.elements + 3) / 4)}) {
      const at::Tensor ops = DropoutKeepMaskTensorOps(d, Positions(positions), chunk);
      ASSERT_EQ(ops.scalar_type(), at::kBool);
      EXPECT_TRUE(at::equal(loop, ops))
          << "layer " << c.layer << " heads " << c.heads << " chunk " << chunk << ": "
          << at::ne(loop, ops).sum().item<int64_t>() << " elements differ";
    }
  }
}

TEST(DropoutMask, KeepsAboutOneMinusP) {
  DropoutDraw d;
  d.seed = 3;
  d.elements = 1 << 20;
  for (double p : {0.1, 0.5}) {
    d.p = p;
    const double kept = CpuLoop(d, {17}).to(at::kDouble).mean().item<double>();
    // 5 standard deviations of a binomial mean over 2^20 draws.
    EXPECT_NEAR(kept, 1.0 - p, 5.0 * std::sqrt(p * (1 - p) / d.elements)) << "p " << p;
  }
}

// A row's mask depends on its position, not on where it sits in the batch or what else is drawn
// with it; a TP rank's heads are a slice of the unsharded draw.
TEST(DropoutMask, RowsAndHeadsAreIndependentOfTheDraw) {
  DropoutDraw d;
  d.seed = 11;
  d.site = DropoutSite::kAttn;
  d.layer = 1;
  d.heads = 8;
  d.elements = 8 * 8;
  d.p = 0.1;
  const at::Tensor batch = CpuLoop(d, {4, 9, 100});
  EXPECT_TRUE(at::equal(batch[1], CpuLoop(d, {9})[0]));
  EXPECT_TRUE(at::equal(batch[2], CpuLoop(d, {77, 100})[1]));
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      DropoutDraw shard = d;
      shard.heads = 8 / tp;
      shard.first_head = r * shard.heads;
      EXPECT_TRUE(
          at::equal(CpuLoop(shard, {4, 9, 100}), batch.narrow(1, shard.first_head, shard.heads)))
          << "tp " << tp << " rank " << r;
    }
  }
}

// Sequence parallelism: TP rank r's [B, S/tp, E] shard draws elements [r·(S/tp)·E, +(S/tp)·E)
// of each row's stream, which must be exactly that slice of the whole [S, E] mask, on the CPU
// loop and the tensor ops (offsets that start mid-counter included), whatever the chunking.
TEST(DropoutMask, SequenceShardIsTheSliceOfTheWholeMask) {
  const std::vector<int64_t> positions = {3, 4, (int64_t{1} << 33) + 7};
  for (const int64_t E : {8, 5, 3}) {  // E = 5, 3: shards start at elements that are not 4k
    DropoutDraw whole;
    whole.seed = 0xC0FFEE;
    whole.site = DropoutSite::kResidMlp;
    whole.layer = 2;
    whole.p = 0.3;
    const int64_t S = 12;
    whole.elements = S * E;
    const at::Tensor full = CpuLoop(whole, positions);
    for (int tp : {2, 3, 4}) {
      for (int r = 0; r < tp; ++r) {
        DropoutDraw shard = whole;
        shard.elements = S / tp * E;
        shard.first_element = r * shard.elements;
        const at::Tensor want = full.narrow(2, shard.first_element, shard.elements);
        EXPECT_TRUE(at::equal(CpuLoop(shard, positions), want))
            << "loop: E " << E << " tp " << tp << " rank " << r;
        for (int64_t chunk : {int64_t{1} << 24, int64_t{1}}) {
          EXPECT_TRUE(at::equal(DropoutKeepMaskTensorOps(shard, Positions(positions), chunk), want))
              << "tensor ops: E " << E << " tp " << tp << " rank " << r << " chunk " << chunk;
        }
      }
    }
  }
  // The offset is part of the range check: the last element of a draw must stay inside.
  DropoutDraw d;
  d.elements = 4;
  d.first_element = philox::kMaxElements - 3;
  EXPECT_THROW(CpuLoop(d, {0}), c10::Error);
}

// The negative controls: every coordinate of the mapping changes the mask.
TEST(DropoutMask, EveryCoordinateSelectsADifferentMask) {
  DropoutDraw base;
  base.seed = 5;
  base.site = DropoutSite::kResidAttn;
  base.layer = 2;
  base.elements = 256;
  base.p = 0.5;
  const at::Tensor ref = CpuLoop(base, {1000})[0][0];
  const auto differs = [&](const DropoutDraw& d, int64_t position) {
    return !at::equal(ref, CpuLoop(d, {position})[0][0]);
  };
  EXPECT_TRUE(differs(base, 1001));                // the next row
  EXPECT_TRUE(differs(base, 1000 + (1LL << 32)));  // the position's high word
  DropoutDraw d = base;
  d.seed = 6;
  EXPECT_TRUE(differs(d, 1000));
  d = base;
  d.layer = 3;
  EXPECT_TRUE(differs(d, 1000));
  d = base;
  d.site = DropoutSite::kResidMlp;
  EXPECT_TRUE(differs(d, 1000));
  d = base;
  d.site = DropoutSite::kAttn;
  d.first_head = 1;
  EXPECT_TRUE(differs(d, 1000));
  // The 4-element groups of a row come from different counters: not all the same pattern.
  const at::Tensor g = ref.view({64, 4}).to(at::kInt);
  const at::Tensor patterns =
      g.select(1, 0) * 8 + g.select(1, 1) * 4 + g.select(1, 2) * 2 + g.select(1, 3);
  EXPECT_GT(std::get<0>(at::_unique(patterns)).numel(), 8);
}

TEST(DropoutMask, OutOfRangeDrawsNameTheField) {
  DropoutDraw d;
  d.elements = 4;
  d.layer = philox::kMaxLayers;
  try {
    CpuLoop(d, {0});
    FAIL() << "layer 65536 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_layer"), std::string::npos) << e.what();
  }
  d.layer = 0;
  d.site = DropoutSite::kAttn;
  d.first_head = philox::kMaxHeads - 1;
  d.heads = 2;
  try {
    DropoutKeepMaskTensorOps(d, Positions({0}));
    FAIL() << "head 16384 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace latchkey
