#include "worker/data/token_source.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "common/latch.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

// This binary's scratch folder, removed at exit.
const testing::ScopedTempDir& Scratch() {
  static const testing::ScopedTempDir dir("token-source");
  return dir;
}

std::string WriteU16(const std::string& name, const std::vector<uint16_t>& v) {
  const std::string path = Scratch() / name;
  std::ofstream o(path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(v.data()), v.size() * 2);
  return path;
}

TEST(TokenSource, SamplesFollowDesignOrder) {
  std::vector<uint16_t> toks(20);
  for (int i = 0; i < 20; ++i) toks[i] = i;
  auto src = OpenTokenFile(WriteU16("order.bin", toks), TokenDtype::kUint16, 4, 256, "f");
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_samples(), 4);  // floor((20-1)/4)
  int64_t out[5];
  (*src)->Sample(1, out);
  EXPECT_EQ(std::vector<int64_t>(out, out + 5), (std::vector<int64_t>{4, 5, 6, 7, 8}));
  (*src)->Sample(5, out);  // modulo the sample count
  EXPECT_EQ(out[0], 4);
  // The fixed-layout order ((M_s + m) * DP + d) * MB + b, with first_sample = M_s * DP * MB.
  EXPECT_EQ(StreamPosition(/*first_sample=*/3 * 2 * 2,
                           MicroBatchSlot(/*split=*/{}, /*dp=*/2, /*d=*/1, /*j=*/1), /*mb=*/2,
                           /*b=*/1),
            ((3 + 1) * 2 + 1) * 2 + 1);
}

TEST(TokenSource, RefusesBadFiles) {
  auto missing =
      OpenTokenFile("/nonexistent/x.bin", TokenDtype::kUint16, 4, 256, "latchkey.data.tokens_file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("latchkey.data.tokens_file"), std::string::npos);
  auto short_file = OpenTokenFile(WriteU16("short.bin", {1, 2, 3}), TokenDtype::kUint16, 4, 256,
                                  "latchkey.data.tokens_file");
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kInvalidArgument);
  auto big_id = OpenTokenFile(WriteU16("big.bin", {1, 2, 300, 4, 5, 6}), TokenDtype::kUint16, 4,
                              256, "latchkey.data.tokens_file");
  EXPECT_EQ(big_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big_id.status().message().find("index 2"), std::string::npos);
}

TEST(TokenSource, TokenizeBytes) {
  const std::string text = Scratch() / "t.txt";
  { std::ofstream(text) << "ab\xff"; }
  const std::string out = Scratch() / "t.bin";
  auto n = TokenizeBytesFile(text, out);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3);
  auto src = OpenTokenFile(out, TokenDtype::kUint16, 2, 256, "f");
  ASSERT_TRUE(src.ok());
  int64_t s[3];
  (*src)->Sample(0, s);
  EXPECT_EQ(std::vector<int64_t>(s, s + 3), (std::vector<int64_t>{'a', 'b', 255}));
}

TEST(TokenSource, SyntheticIsDeterministic) {
  auto a = MakeSyntheticSource(7, 8, 256);
  auto b = MakeSyntheticSource(7, 8, 256);
  int64_t x[9], y[9];
  a->Sample(12345, x);
  b->Sample(12345, y);
  EXPECT_EQ(std::vector<int64_t>(x, x + 9), std::vector<int64_t>(y, y + 9));
  for (int64_t t : x) EXPECT_LT(t, 256);
}

}  // namespace
}  // namespace latchkey
