// The Megatron reader's refusals, one per corrupt field, and the cost of opening a large .bin.
#include "worker/data/megatron_index.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "tests/support/temp_dir.h"
#include "worker/data/megatron_test_util.h"

namespace latchkey {
namespace {

using testing::MakeMegatronFiles;
using testing::MegatronFiles;
using testing::WriteMegatronFiles;

const testing::ScopedTempDir& Scratch() {
  static const testing::ScopedTempDir dir("megatron-index");
  return dir;
}

MegatronFiles Good() { return MakeMegatronFiles(8, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}}, {0, 2, 3}); }

// Opens `f` written under `name`; expects `code` and a message naming `file_suffix` and `field`.
void ExpectRefused(const std::string& name, const MegatronFiles& f, absl::StatusCode code,
                   const std::string& file_suffix, const std::string& field) {
  const std::string prefix = Scratch() / name;
  WriteMegatronFiles(prefix, f);
  auto d = MegatronIndexedDataset::Open(prefix, 100);
  ASSERT_FALSE(d.ok()) << name;
  EXPECT_EQ(d.status().code(), code) << d.status();
  EXPECT_NE(d.status().message().find(prefix + file_suffix + ": " + field), std::string::npos)
      << d.status();
}

TEST(MegatronIndex, ReadsEveryDtype) {
  for (int code = 1; code <= 8; ++code) {
    const std::string prefix = Scratch() / ("dtype" + std::to_string(code));
    WriteMegatronFiles(prefix, MakeMegatronFiles(code, {{1, 2, 3}, {4, 5, 99}}));
    auto d = MegatronIndexedDataset::Open(prefix, 100);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)->dtype_code(), code);
    EXPECT_EQ((*d)->num_sequences(), 2);
    EXPECT_EQ((*d)->num_documents(), 3);
    EXPECT_EQ((*d)->length(1), 3);
    int64_t out[3];
    ASSERT_TRUE((*d)->Read(1, 0, 3, out).ok());
    EXPECT_EQ(std::vector<int64_t>(out, out + 3), (std::vector<int64_t>{4, 5, 99}));
    ASSERT_TRUE((*d)->Read(0, 1, 2, out).ok());
    EXPECT_EQ(std::vector<int64_t>(out, out + 2), (std::vector<int64_t>{2, 3}));
  }
}

TEST(MegatronIndex, RefusesBadMagic) {
  MegatronFiles f = Good();
  f.idx[0] = 'X';
  ExpectRefused("magic", f, absl::StatusCode::kDataLoss, ".idx", "magic");
}

TEST(MegatronIndex, RefusesOtherVersion) {
  MegatronFiles f = Good();
  f.idx[9] = 2;
  ExpectRefused("version", f, absl::StatusCode::kInvalidArgument, ".idx", "version");
}

TEST(MegatronIndex, RefusesUnknownDtypeCode) {
  for (int code : {0, 9, 255}) {
    MegatronFiles f = Good();
    f.idx[17] = static_cast<char>(code);
    ExpectRefused("dtype" + std::to_string(code) + "x", f, absl::StatusCode::kInvalidArgument,
                  ".idx", "dtype code");
  }
}

TEST(MegatronIndex, RefusesCountsThatDoNotMatchTheFile) {
  MegatronFiles f = Good();
  f.idx[18] = 4;  // 4 sequences claimed, 3 present
  ExpectRefused("count", f, absl::StatusCode::kDataLoss, ".idx", "sequence count");
  MegatronFiles g = Good();
  g.idx.resize(g.idx.size() - 3);
  ExpectRefused("truncated", g, absl::StatusCode::kDataLoss, ".idx", "sequence count");
  ExpectRefused("header", MegatronFiles{"MMIDIDX", ""}, absl::StatusCode::kDataLoss, ".idx",
                "header");
}

TEST(MegatronIndex, RefusesPointersThatDoNotMatchTheLengths) {
  MegatronFiles f = Good();
  f.idx[34 + 12 + 8] = 7;  // pointer[1]: 7 instead of 6 (3 uint16 tokens)
  ExpectRefused("pointer", f, absl::StatusCode::kDataLoss, ".idx", "pointer[1]");
  MegatronFiles g = Good();
  g.idx[34] = static_cast<char>(0xff);  // length[0] = -1 after the other bytes
  g.idx[35] = g.idx[36] = g.idx[37] = static_cast<char>(0xff);
  ExpectRefused("length", g, absl::StatusCode::kDataLoss, ".idx", "sequence length[0]");
}

TEST(MegatronIndex, RefusesABinShorterThanThePointers) {
  MegatronFiles f = Good();
  f.bin.resize(f.bin.size() - 1);
  ExpectRefused("short", f, absl::StatusCode::kDataLoss, ".bin", "size");
}

TEST(MegatronIndex, RefusesDocumentIndicesOutOfOrder) {
  ExpectRefused("docs", MakeMegatronFiles(8, {{1}, {2}, {3}}, {0, 2, 1, 3}),
                absl::StatusCode::kDataLoss, ".idx", "document index[2]");
  ExpectRefused("docs0", MakeMegatronFiles(8, {{1}, {2}, {3}}, {1, 3}), absl::StatusCode::kDataLoss,
                ".idx", "document index[0]");
  ExpectRefused("docsend", MakeMegatronFiles(8, {{1}, {2}, {3}}, {0, 2}),
                absl::StatusCode::kDataLoss, ".idx", "document index[1]");
}

TEST(MegatronIndex, RefusesATokenAtOrAboveVocabAtItsFirstUse) {
  const std::string prefix = Scratch() / "vocab";
  WriteMegatronFiles(prefix, MakeMegatronFiles(4, {{1, 2, 3}, {4, 100, 6}}));
  auto d = MegatronIndexedDataset::Open(prefix, 100);  // opening reads no token
  ASSERT_TRUE(d.ok()) << d.status();
  int64_t out[3];
  EXPECT_TRUE((*d)->Read(0, 0, 3, out).ok());
  absl::Status st = (*d)->Read(1, 0, 3, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(prefix + ".bin: token 100 at position 1 of sequence 1"),
            std::string::npos)
      << st;
  WriteMegatronFiles(prefix + "f", MakeMegatronFiles(7, {{1, 2}}));
  std::fstream bin(prefix + "f.bin", std::ios::binary | std::ios::in | std::ios::out);
  const float half = 1.5f;
  bin.seekp(4);
  bin.write(reinterpret_cast<const char*>(&half), 4);
  bin.close();
  auto f = MegatronIndexedDataset::Open(prefix + "f", 100);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->Read(0, 0, 2, out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MegatronIndex, MissingFilesAreNotFound) {
  auto d = MegatronIndexedDataset::Open(Scratch() / "nothing", 100);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("nothing.idx"), std::string::npos);
  const std::string prefix = Scratch() / "nobin";
  WriteMegatronFiles(prefix, Good());
  ::unlink((prefix + ".bin").c_str());
  d = MegatronIndexedDataset::Open(prefix, 100);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("nobin.bin"), std::string::npos);
}

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// A 10 GB .bin (sparse: holes read as token 0) with a 1000-sequence .idx: opening checks the
// index, maps the .bin and reads none of it.
TEST(MegatronIndex, OpensATenGigabyteBinQuicklyAndSmall) {
  const std::string prefix = Scratch() / "big";
  const int64_t kSequences = 1000;
  const int64_t kBytes = 10'000'000'000;
  const int32_t len = static_cast<int32_t>(kBytes / 2 / kSequences);  // uint16 tokens
  MegatronFiles f = MakeMegatronFiles(8, std::vector<std::vector<int64_t>>(kSequences));
  // Patch the lengths and pointers to the sizes of the big file (the test helper wrote 0s).
  for (int64_t i = 0; i < kSequences; ++i) {
    std::memcpy(&f.idx[34 + 4 * i], &len, 4);
    const int64_t ptr = i * len * 2;
    std::memcpy(&f.idx[34 + 4 * kSequences + 8 * i], &ptr, 8);
  }
  std::ofstream(prefix + ".idx", std::ios::binary) << f.idx;
  {
    std::ofstream bin(prefix + ".bin", std::ios::binary);
    bin.seekp(kBytes - 1);
    bin.put('\0');
  }
  const int64_t rss_before = RssBytes();
  const auto t0 = std::chrono::steady_clock::now();
  auto d = MegatronIndexedDataset::Open(prefix, 50000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(d.ok()) << d.status();
  int64_t out[4];
  ASSERT_TRUE((*d)->Read(kSequences - 1, len - 4, 4, out).ok());  // the last page only
  const int64_t growth = RssBytes() - rss_before;
  std::printf("10 GB .bin: open %.4f s, RSS growth %.2f MB\n", seconds, growth / 1e6);
  EXPECT_LT(seconds, 1.0);
  EXPECT_LT(growth, 50'000'000);
  EXPECT_EQ(out[3], 0);
}

}  // namespace
}  // namespace latchkey
