// Megatron-Core's sample order: numpy's RandomState, the blend rule, the oracle fixture made
// with megatron-core (testdata/megatron), the index cache and the cost of building indices.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <iterator>

#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"
#include "worker/data/gpt_indices.h"
#include "worker/data/index_cache.h"
#include "worker/data/megatron_source.h"
#include "worker/data/megatron_test_util.h"
#include "worker/data/numpy_random.h"

namespace latchkey {
namespace {

using nlohmann::json;

const testing::ScopedTempDir& Scratch() {
  static const testing::ScopedTempDir dir("megatron-order");
  return dir;
}

// numpy.random.RandomState(seed).shuffle(arange(n)), first 8 entries (values from numpy 1.24 and
// 2.2, which agree).
TEST(NumpyRandom, ShuffleMatchesNumpy) {
  struct Case {
    uint32_t seed;
    int n;
    std::vector<int64_t> first;
  };
  for (const Case& c :
       std::vector<Case>{{1234, 10, {7, 2, 9, 1, 0, 8, 4, 5}},
                         {0, 5, {2, 0, 1, 3, 4}},
                         {4294967295u, 7, {1, 5, 0, 6, 4, 2, 3}},
                         {42, 100000, {75721, 80184, 19864, 76699, 92991, 76434, 84004, 80917}}}) {
    LegacyRandomState rng(c.seed);
    std::vector<int32_t> a(static_cast<size_t>(c.n));
    for (int i = 0; i < c.n; ++i) a[i] = i;
    rng.Shuffle(&a);
    EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + c.first.size()), c.first) << c.seed;
  }
  // The same state shuffles a second array on (as GPTDataset's shuffle index follows the
  // document index): numpy gives [7, 3, 5, 1, 4, 8, 0, 2] after the first 10-shuffle.
  LegacyRandomState rng(1234);
  std::vector<int64_t> a(10), b(10);
  for (int i = 0; i < 10; ++i) a[i] = b[i] = i;
  rng.Shuffle(&a);
  rng.Shuffle(&b);
  EXPECT_EQ(std::vector<int64_t>(b.begin(), b.begin() + 8),
            (std::vector<int64_t>{7, 3, 5, 1, 4, 8, 0, 2}));
}

TEST(MegatronBlend, LargestErrorFirstMaximumWins) {
  std::vector<int16_t> dataset;
  std::vector<int64_t> sample;
  BuildBlendingIndices(NormalizeWeights({0.5, 0.25, 0.25}), 4, &dataset, &sample);
  EXPECT_EQ(std::vector<int64_t>(dataset.begin(), dataset.end()),
            (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_EQ(sample, (std::vector<int64_t>{0, 0, 0, 1}));
  int64_t blend_size = 0;
  EXPECT_EQ(BlendSizes(NormalizeWeights({2, 1, 1}), 4, &blend_size),
            (std::vector<int64_t>{3, 2, 2}));  // ceil(ceil(4 w) * 1.005)
  EXPECT_EQ(blend_size, 4);
}

TEST(MegatronSplit, BoundsRoundHalfToEven) {
  auto w = ParseMegatronSplit("f", "90,5,5");
  ASSERT_TRUE(w.ok());
  auto b = SplitBounds(*w, 31);
  ASSERT_TRUE(b[0] && b[1] && b[2]);
  EXPECT_EQ(*b[0], std::make_pair(int64_t{0}, int64_t{28}));   // round(27.9)
  EXPECT_EQ(*b[1], std::make_pair(int64_t{28}, int64_t{29}));  // round(29.45) = 29
  EXPECT_EQ(*b[2], std::make_pair(int64_t{29}, int64_t{31}));
  auto one = SplitBounds(*ParseMegatronSplit("f", "1"), 10);
  EXPECT_TRUE(one[0].has_value());
  EXPECT_FALSE(one[1].has_value());
  EXPECT_FALSE(one[2].has_value());
  EXPECT_FALSE(ParseMegatronSplit("f", "0,0").ok());
  EXPECT_FALSE(ParseMegatronSplit("f", "1,2,3,4").ok());
  EXPECT_FALSE(ParseMegatronSplit("f", "90,-5").ok());
}

json Fixture() {
  std::ifstream in(std::string(LATCHKEY_SOURCE_DIR) + "/testdata/megatron/expected.json");
  return json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

JobSpec FixtureSpec(const json& c, const std::string& cache) {
  JobSpec spec;
  spec.model.vocab_size = 1000;
  spec.seq_len = c["seq_length"].get<int>();
  spec.data.format = DataFormat::kMegatron;
  spec.data.split = "90,5,5";
  spec.data.megatron_seed = c["seed"].get<uint64_t>();
  spec.data.num_samples = c["num_samples"].get<int64_t>();
  spec.data.cache_dir = cache;
  const std::string dir = std::string(LATCHKEY_SOURCE_DIR) + "/testdata/megatron/";
  if (c["weights"].is_null()) {
    spec.data.path_prefix = dir + c["path_prefix"][0].get<std::string>();
  } else {
    for (size_t i = 0; i < c["path_prefix"].size(); ++i) {
      spec.data.blend.push_back(
          {c["weights"][i].get<double>(), dir + c["path_prefix"][i].get<std::string>()});
    }
  }
  return spec;
}

void ExpectSamples(const TokenSource& src, const json& expected, const std::string& what) {
  ASSERT_EQ(src.num_samples(), expected["num_samples"].get<int64_t>()) << what;
  const auto& rows = expected["tokens"];
  std::vector<int64_t> out(static_cast<size_t>(src.seq_len() + 1));
  for (size_t k = 0; k < rows.size(); ++k) {
    ASSERT_TRUE(src.Read(static_cast<int64_t>(k), out.data()).ok()) << what;
    ASSERT_EQ(out, rows[k].get<std::vector<int64_t>>()) << what << " sample " << k;
  }
  // Positions past the end wrap around to sample 0.
  ASSERT_TRUE(src.Read(src.num_samples(), out.data()).ok());
  EXPECT_EQ(out, rows[0].get<std::vector<int64_t>>()) << what;
}

// Every case of the fixture: the train samples (both epoch-separation paths, both sequence
// lengths, three dtypes, the blend) and the validation samples, token for token.
TEST(MegatronOracle, SamplesEqualMegatronCore) {
  const json f = Fixture();
  ASSERT_EQ(f["cases"].size(), 14u);
  for (const json& c : f["cases"]) {
    const std::string name = c["name"].get<std::string>();
    JobSpec spec = FixtureSpec(c, Scratch() / ("oracle-" + name));
    auto train = OpenMegatronSource(spec, MegatronSplit::kTrain, spec.data.num_samples);
    ASSERT_TRUE(train.ok()) << name << ": " << train.status();
    ExpectSamples(**train, c["train"], name + " train");
    auto valid =
        OpenMegatronSource(spec, MegatronSplit::kValidation, c["eval_samples"].get<int64_t>());
    ASSERT_TRUE(valid.ok()) << name << ": " << valid.status();
    ExpectSamples(**valid, c["validation"], name + " validation");
  }
}

TEST(MegatronCache, OneBuildThenReadsAndRefusesAlteredFiles) {
  const json f = Fixture();
  const json& c = f["cases"][0];
  const std::string cache = Scratch() / "cache";
  JobSpec spec = FixtureSpec(c, cache);
  MegatronOpenInfo first, second, third;
  ASSERT_TRUE(OpenMegatronSource(spec, MegatronSplit::kTrain, 86, &first).ok());
  EXPECT_EQ(first.cache_builds, 1);
  auto again = OpenMegatronSource(spec, MegatronSplit::kTrain, 86, &second);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(second.cache_hits, 1);
  EXPECT_EQ(second.cache_builds, 0);
  ExpectSamples(**again, c["train"], "cached");
  // Alter one shuffle entry of the cached file: its checksum no longer matches, so it is
  // refused and rebuilt, and the samples stay Megatron's.
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    if (e.path().extension() == ".lkidx") path = e.path().string();
  }
  ASSERT_FALSE(path.empty());
  {
    std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(-80, std::ios::end);
    io.put('\x7f');
  }
  auto rebuilt = OpenMegatronSource(spec, MegatronSplit::kTrain, 86, &third);
  ASSERT_TRUE(rebuilt.ok());
  EXPECT_EQ(third.cache_refused, 1);
  EXPECT_EQ(third.cache_builds, 1);
  ExpectSamples(**rebuilt, c["train"], "rebuilt");
  // Another seed is another index (another file), never the cached one.
  spec.data.megatron_seed = 99;
  MegatronOpenInfo other;
  ASSERT_TRUE(OpenMegatronSource(spec, MegatronSplit::kTrain, 86, &other).ok());
  EXPECT_EQ(other.cache_builds, 1);
}

// A million documents: building the indices (document, sample and shuffle index) and writing the
// cache, then reading it back, each within 1 s of CPU time.
TEST(MegatronCache, AMillionDocumentsWithinOneSecond) {
  const int64_t kDocs = 1'000'000;
  const std::string prefix = Scratch() / "million";
  testing::MegatronFiles f = testing::MakeMegatronFiles(8, {});
  {
    // Header, lengths 1..200, pointers, document indices; the .bin sparse.
    std::string idx = f.idx.substr(0, 18);
    const uint64_t n = kDocs, nd = kDocs + 1;
    idx.append(reinterpret_cast<const char*>(&n), 8);
    idx.append(reinterpret_cast<const char*>(&nd), 8);
    std::vector<int32_t> len(kDocs);
    std::vector<int64_t> ptr(kDocs), doc(kDocs + 1);
    int64_t p = 0;
    for (int64_t i = 0; i < kDocs; ++i) {
      len[i] = 1 + static_cast<int32_t>((i * 7919) % 200);
      ptr[i] = p;
      p += 2 * len[i];
      doc[i] = i;
    }
    doc[kDocs] = kDocs;
    idx.append(reinterpret_cast<const char*>(len.data()), 4 * kDocs);
    idx.append(reinterpret_cast<const char*>(ptr.data()), 8 * kDocs);
    idx.append(reinterpret_cast<const char*>(doc.data()), 8 * (kDocs + 1));
    std::ofstream(prefix + ".idx", std::ios::binary) << idx;
    std::ofstream bin(prefix + ".bin", std::ios::binary);
    bin.seekp(p - 1);
    bin.put('\0');
  }
  JobSpec spec;
  spec.model.vocab_size = 50000;
  spec.seq_len = 1024;
  spec.data.format = DataFormat::kMegatron;
  spec.data.path_prefix = prefix;
  spec.data.split = "100,0,0";
  spec.data.megatron_seed = 1;
  spec.data.cache_dir = Scratch() / "million-cache";
  spec.data.num_samples = 100'000;
  for (bool build : {true, false}) {
    MegatronOpenInfo info;
    const std::clock_t t0 = std::clock();
    auto src = OpenMegatronSource(spec, MegatronSplit::kTrain, spec.data.num_samples, &info);
    const double cpu = static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;
    ASSERT_TRUE(src.ok()) << src.status();
    EXPECT_EQ(info.cache_builds, build ? 1 : 0);
    std::printf("1M documents, %s: %.3f s CPU, %lld samples\n", build ? "build" : "cached read",
                cpu, static_cast<long long>((*src)->num_samples()));
    EXPECT_LT(cpu, 1.0);
  }
}

}  // namespace
}  // namespace latchkey
