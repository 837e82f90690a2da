// The logical layout table and the pieces written from it, torch-free: every layout's regions
// tile every logical tensor exactly once, replicas are named as such, writers spread, and a
// checkpoint written by one layout reads back into every other layout value for value.
#include "worker/checkpoint/logical_layout.h"

#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/pieces.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;

ModelConfig Tiny() {
  ModelConfig m;  // 2 layers, E 64, 8 heads, MQA
  m.vocab_size = 96;
  m.n_positions = 32;
  return m;
}

// The value of element (row, col) of a parameter's logical tensor `kind`: distinct everywhere.
float Value(TensorKind kind, int param, int64_t row, int64_t col) {
  return static_cast<float>(kind) * 1e6f + param * 1e4f + row * 97.0f + col;
}

// A rank's held values of every kind, as the engine's buffers would hold them.
std::vector<std::vector<float>> HeldValues(const LayoutTable& t, int rank) {
  std::vector<std::vector<float>> out;
  for (TensorKind kind : t.kinds()) {
    const auto [begin, end] = t.HeldRange(rank, kind);
    std::vector<float> v(end - begin, -1.0f);
    for (const auto& [block, flat] : t.Cover(rank % t.spec().tp, begin, end)) {
      for (int64_t i = 0; i < block.rect.numel(); ++i) {
        v[flat - begin + i] = Value(kind, block.param, block.rect.row + i / block.rect.cols,
                                    block.rect.col + i % block.rect.cols);
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

LayoutSpec Layout(int tp, int dp, int zero, bool bf16) {
  return LayoutSpec{Tiny(), tp, dp, zero, bf16, /*adamw=*/true};
}

TEST(LogicalLayout, RegionsTileEveryTensorOnceAndNameTheirReplicas) {
  for (const LayoutSpec& spec : {Layout(2, 2, 1, false), Layout(4, 1, 0, false),
                                 Layout(1, 4, 1, true), Layout(2, 3, 1, true)}) {
    absl::StatusOr<LayoutTable> t = LayoutTable::Build(spec);
    ASSERT_TRUE(t.ok()) << t.status();
    std::map<std::pair<int, int>, int64_t> covered;
    std::vector<int64_t> written(spec.world(), 0);
    for (const Region& r : t->regions()) {
      covered[{static_cast<int>(r.kind), r.param}] += r.rect.numel();
      written[r.writer] += r.rect.numel();
      EXPECT_THAT(r.holders, ::testing::Contains(r.writer));
      // TP-replicated params (LayerNorms, embeddings) are held by every TP rank.
      if (t->param_name(r.param) == "transformer.ln_f.weight") {
        EXPECT_EQ(r.holders.size() % spec.tp, 0u);
      }
    }
    for (const auto& [key, n] : covered) {
      int64_t full = 1;
      for (int64_t d : t->global_shape(key.second)) full *= d;
      EXPECT_EQ(n, full) << t->param_name(key.second) << " kind " << key.first;
    }
    // Every rank writes part of the state.
    for (int r = 0; r < spec.world(); ++r) EXPECT_GT(written[r], 0) << "rank " << r;
  }
}

TEST(LogicalLayout, AZeroPartitionCutBecomesAtMostThreeRectangles) {
  absl::StatusOr<LayoutTable> t = LayoutTable::Build(Layout(1, 1, 0, false));
  ASSERT_TRUE(t.ok());
  const Block& wte = t->blocks(0)[0];  // [96, 64]
  const auto cover = t->Cover(0, 10, 64 * 5 + 3);
  ASSERT_EQ(cover.size(), 3u);
  EXPECT_EQ(cover[0].first.rect, (Rect{0, 10, 1, 54}));
  EXPECT_EQ(cover[1].first.rect, (Rect{1, 0, 4, 64}));
  EXPECT_EQ(cover[2].first.rect, (Rect{5, 0, 1, 3}));
  EXPECT_EQ(wte.rect, (Rect{0, 0, 96, 64}));
}

TEST(LogicalLayout, MqaKvRowsAreReplicatedQueryRowsSharded) {
  absl::StatusOr<LayoutTable> t = LayoutTable::Build(Layout(2, 1, 0, false));
  ASSERT_TRUE(t.ok());
  int seen = 0;
  for (const Region& r : t->regions()) {
    if (r.kind != TensorKind::kParam ||
        t->param_name(r.param) != "transformer.h.0.attn.c_attn.weight") {
      continue;
    }
    ++seen;
    if (r.rect.row >= 64) {  // K/V rows [E, E + 2D)
      EXPECT_EQ(r.rect, (Rect{64, 0, 16, 64}));
      EXPECT_EQ(r.holders, (std::vector<int>{0, 1}));
    } else {
      EXPECT_EQ(r.holders.size(), 1u);
      EXPECT_EQ(r.rect.rows, 32);
    }
  }
  EXPECT_EQ(seen, 3);
}

// Writes a checkpoint of `from`'s state, reads it into `to`, compares every value.
void RoundTrip(const LayoutSpec& from, const LayoutSpec& to) {
  const testing::ScopedTempDir root("layout");
  absl::StatusOr<LayoutTable> src = LayoutTable::Build(from);
  absl::StatusOr<LayoutTable> dst = LayoutTable::Build(to);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string temp = JoinPath(root.path(), CheckpointTempDirName(2, "", 1));
  CheckpointManifest m;
  m.step = 2;
  m.next_window = 3;
  m.world_size = from.world();
  m.tp = from.tp;
  m.dp = from.dp;
  m.zero_stage = from.zero_stage;
  m.bf16 = from.bf16;
  m.optimizer = "AdamW";
  m.optimizer_step = 3;
  m.model = from.model;
  std::vector<std::vector<std::string>> digests;
  for (int r = 0; r < from.world(); ++r) {
    const auto held = HeldValues(*src, r);
    std::vector<const float*> ptrs;
    for (const auto& v : held) ptrs.push_back(v.data());
    digests.push_back(ShareDigests(*src, r, ptrs));
    absl::StatusOr<CheckpointFileEntry> e = WriteShare(*src, temp, r, 2, ptrs);
    ASSERT_TRUE(e.ok()) << e.status();
    m.files.push_back(*e);
  }
  absl::StatusOr<std::vector<CheckpointTensor>> tensors = TensorsFromDigests(*src, digests, 2);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  m.tensors = *tensors;
  ASSERT_TRUE(CommitCheckpoint(root.path(), temp, m).ok());
  const std::string dir = root / "step-00000002";
  absl::StatusOr<CheckpointManifest> read = ReadCheckpointManifest(dir, "");
  ASSERT_TRUE(read.ok()) << read.status();
  absl::StatusOr<std::unique_ptr<PieceReader>> reader = PieceReader::Open(dir, *read);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->optimizer_step(), 3);
  for (int r = 0; r < to.world(); ++r) {
    const auto want = HeldValues(*dst, r);
    const std::vector<TensorKind> kinds = dst->kinds();
    for (size_t k = 0; k < kinds.size(); ++k) {
      const auto [begin, end] = dst->HeldRange(r, kinds[k]);
      std::vector<float> got(end - begin, -2.0f);
      ASSERT_TRUE((*reader)->FillFlat(*dst, r % to.tp, kinds[k], begin, end, got.data()).ok());
      EXPECT_EQ(got, want[k]) << "rank " << r << " " << TensorKindName(kinds[k]);
    }
  }
}

TEST(LogicalLayout, EveryLayoutReadsEveryOthersCheckpoint) {
  const std::vector<LayoutSpec> layouts = {Layout(2, 2, 1, false), Layout(1, 4, 1, false),
                                           Layout(4, 1, 0, false), Layout(1, 1, 0, false),
                                           Layout(2, 1, 1, false), Layout(2, 2, 0, true),
                                           Layout(2, 3, 1, true)};
  for (const LayoutSpec& from : layouts) {
    for (const LayoutSpec& to : layouts) {
      SCOPED_TRACE(::testing::Message()
                   << "tp" << from.tp << "dp" << from.dp << "z" << from.zero_stage << " -> tp"
                   << to.tp << "dp" << to.dp << "z" << to.zero_stage);
      RoundTrip(from, to);
    }
  }
}

TEST(LogicalLayout, ReplicasThatDisagreeAreDataLossNamingTheTensorAndRanks) {
  absl::StatusOr<LayoutTable> t = LayoutTable::Build(Layout(2, 2, 1, false));
  ASSERT_TRUE(t.ok());
  std::vector<std::vector<std::string>> digests;
  for (int r = 0; r < 4; ++r) {
    auto held = HeldValues(*t, r);
    if (r == 3) held[0][0] += 1.0f;  // wte row 0 on rank 3 only
    std::vector<const float*> ptrs;
    for (const auto& v : held) ptrs.push_back(v.data());
    digests.push_back(ShareDigests(*t, r, ptrs));
  }
  absl::StatusOr<std::vector<CheckpointTensor>> tensors = TensorsFromDigests(*t, digests, 7);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(tensors.status().message()),
              HasSubstr("replicas of param/transformer.wte.weight"));
  EXPECT_THAT(std::string(tensors.status().message()), HasSubstr("rank(s) 3 hold"));
  EXPECT_THAT(std::string(tensors.status().message()), HasSubstr("rank(s) 0,1,2 hold"));
}

}  // namespace
}  // namespace latchkey
