#include "worker/checkpoint/safetensors.h"

#include <filesystem>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/files.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;

const std::string kMqa =
    std::string(LATCHKEY_SOURCE_DIR) + "/testdata/gptbigcode-tiny/mqa/model.safetensors";
const std::string kMha =
    std::string(LATCHKEY_SOURCE_DIR) + "/testdata/gptbigcode-tiny/mha/model.safetensors";

std::string Bytes(const std::string& path) {
  absl::StatusOr<std::string> b = ReadWholeFile(path);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : std::string();
}

std::string LengthPrefix(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out;
}

// A raw file with the given header text and data buffer.
std::string Raw(const std::string& header, const std::string& data = "") {
  return LengthPrefix(header.size()) + header + data;
}

// Parses `bytes` and expects failure with `code` and `fragment` in the message.
void ExpectError(const std::string& bytes, absl::StatusCode code, const std::string& fragment) {
  absl::StatusOr<StFile> f = ParseSafetensors(bytes, "t.safetensors");
  ASSERT_FALSE(f.ok()) << "parsed unexpectedly";
  EXPECT_EQ(f.status().code(), code) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(fragment));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("t.safetensors"));
}

TEST(StDtypeTest, NamesAndSizesRoundTrip) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "F64", "I64", "U64"}) {
    std::optional<StDtype> d = ParseStDtype(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_STREQ(StDtypeName(*d), name);
  }
  EXPECT_EQ(StDtypeSize(StDtype::kBF16), 2u);
  EXPECT_EQ(StDtypeSize(StDtype::kF32), 4u);
  EXPECT_EQ(StDtypeSize(StDtype::kI64), 8u);
  EXPECT_FALSE(ParseStDtype("f32").has_value());
}

TEST(SafetensorsTest, ReadsFixture) {
  absl::StatusOr<StFile> f = ReadSafetensorsFile(kMqa);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata.at("format"), "pt");
  EXPECT_EQ(f->tensors.size(), 28u);  // 12 per layer x 2 + wte, wpe, ln_f.{weight,bias}
  for (size_t i = 1; i < f->tensors.size(); ++i) {
    EXPECT_LT(f->tensors[i - 1].name, f->tensors[i].name);
  }
  const StTensor* c_attn = f->Find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->dtype, StDtype::kF32);
  EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{80, 64}));
  EXPECT_EQ(c_attn->NumElements(), 80 * 64);
  EXPECT_EQ(c_attn->data.size(), 80u * 64 * 4);
  const StTensor* wte = f->Find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(f->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(f->Find("transformer.h.1.ln_2.bias")->shape, (std::vector<int64_t>{64}));
}

TEST(SafetensorsTest, FixturesReserializeByteIdentical) {
  for (const std::string& path : {kMqa, kMha}) {
    std::string bytes = Bytes(path);
    absl::StatusOr<StFile> f = ParseSafetensors(bytes, path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(SerializeSafetensors(*f), bytes) << path;
  }
}

TEST(SafetensorsTest, FileRoundTrip) {
  StFile in;
  in.metadata = {{"format", "pt"}, {"note", "quote \" and \xc3\xa9"}};
  // Deliberately not in name order; includes a scalar and an empty tensor.
  in.tensors.push_back({"z.weight", StDtype::kF32, {2, 3}, std::string(24, '\x01')});
  in.tensors.push_back({"a.scalar", StDtype::kI64, {}, std::string("\x07\0\0\0\0\0\0\0", 8)});
  in.tensors.push_back({"m.empty", StDtype::kBF16, {0, 5}, ""});
  in.tensors.push_back({"b.half", StDtype::kF16, {3}, std::string("abcdef")});
  ASSERT_TRUE(ValidateStFile(in).ok());

  const testing::ScopedTempDir tmp_dir("safetensors");
  std::string dir = tmp_dir.path();
  std::string path = dir + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, in).ok());
  absl::StatusOr<StFile> out = ReadSafetensorsFile(path);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->metadata, in.metadata);
  ASSERT_EQ(out->tensors.size(), 4u);
  std::vector<std::string> names;
  for (const StTensor& t : out->tensors) {
    names.push_back(t.name);
    const StTensor* orig = nullptr;
    for (const StTensor& o : in.tensors) {
      if (o.name == t.name) orig = &o;
    }
    ASSERT_NE(orig, nullptr);
    EXPECT_EQ(t.dtype, orig->dtype);
    EXPECT_EQ(t.shape, orig->shape);
    EXPECT_EQ(t.data, orig->data);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a.scalar", "b.half", "m.empty", "z.weight"}));

  std::string bytes = Bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(SerializeSafetensors(*out), bytes);  // stable
  // Data laid out in name order: a.scalar first.
  EXPECT_EQ(bytes.substr(8 + n, 8), std::string("\x07\0\0\0\0\0\0\0", 8));
  // Only the final file is left behind (no temporary files).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(SafetensorsTest, AcceptsPaddedHeaderAndNoMetadata) {
  std::string h = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  absl::StatusOr<StFile> f = ParseSafetensors(Raw(h + "      ", "ab"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->metadata.empty());
  EXPECT_EQ(f->tensors[0].data, "ab");
}

TEST(SafetensorsTest, AcceptsUnorderedOffsetsAndEmptyTensors) {
  std::string h = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},)"
                  R"("b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("c":{"dtype":"F32","shape":[0,4],"data_offsets":[3,3]},)"
                  R"("d":{"dtype":"F32","shape":[4,0],"data_offsets":[0,0]}})";
  absl::StatusOr<StFile> f = ParseSafetensors(Raw(h, "xyz"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("a")->data, "yz");
  EXPECT_EQ(f->Find("b")->data, "x");
  EXPECT_EQ(f->Find("c")->data, "");
}

TEST(SafetensorsTest, TruncatedFixtureIsDataLoss) {
  std::string bytes = Bytes(kMqa);
  uint64_t n = 2616;  // header length of the fixture
  for (size_t cut : {size_t{0}, size_t{3}, size_t{7}, size_t{8}, size_t{100}, size_t(8 + n - 1),
                     size_t(8 + n), size_t(8 + n + 1), bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    absl::StatusOr<StFile> f = ParseSafetensors(bytes.substr(0, cut), "cut.safetensors");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("cut.safetensors"));
    if (cut >= 8) {
      EXPECT_THAT(std::string(f.status().message()), HasSubstr("truncated"));
    }
  }
  ExpectError(bytes.substr(0, 5), absl::StatusCode::kDataLoss, "shorter than the 8-byte");
}

TEST(SafetensorsTest, TruncatedFileOnDiskNamesThePath) {
  const testing::ScopedTempDir tmp_dir("safetensors");
  std::string dir = tmp_dir.path();
  std::string path = dir + "/cut.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, Bytes(kMqa).substr(0, 5000)).ok());
  absl::StatusOr<StFile> f = ReadSafetensorsFile(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
}

TEST(SafetensorsTest, CorruptHeaderLength) {
  std::string bytes = Bytes(kMqa);
  ExpectError(LengthPrefix(~0ull) + bytes.substr(8), absl::StatusCode::kInvalidArgument,
              "exceeds the 100000000-byte limit");
  ExpectError(LengthPrefix(bytes.size()) + bytes.substr(8), absl::StatusCode::kDataLoss,
              "bytes follow the length");
  // Too short: the JSON is cut.
  ExpectError(LengthPrefix(2000) + bytes.substr(8), absl::StatusCode::kInvalidArgument,
              "not valid JSON");
  // Too long by 8: the JSON swallows data bytes.
  ExpectError(LengthPrefix(2624) + bytes.substr(8), absl::StatusCode::kInvalidArgument,
              "not valid JSON");
}

TEST(SafetensorsTest, BadJson) {
  ExpectError(Raw(""), absl::StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(Raw("{\"a\":"), absl::StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(Raw("{} x"), absl::StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(Raw("[1,2]"), absl::StatusCode::kInvalidArgument, "not a JSON object but array");
  ExpectError(Raw("\"s\""), absl::StatusCode::kInvalidArgument, "not a JSON object");
  ExpectError(Raw("{\"\xff\":1}"), absl::StatusCode::kInvalidArgument, "not valid JSON");
}

TEST(SafetensorsTest, BadMetadata) {
  ExpectError(Raw(R"({"__metadata__":[1]})"), absl::StatusCode::kInvalidArgument,
              "__metadata__ is not an object");
  ExpectError(Raw(R"({"__metadata__":{"format":1}})"), absl::StatusCode::kInvalidArgument,
              "__metadata__ value for 'format' is not a string");
}

TEST(SafetensorsTest, BadEntries) {
  struct Case {
    std::string entry;
    std::string fragment;
  };
  const Case cases[] = {
      {R"(5)", "tensor 'x': entry is not an object"},
      {R"({"shape":[1],"data_offsets":[0,1]})", "tensor 'x': missing field \"dtype\""},
      {R"({"dtype":"U8","data_offsets":[0,1]})", "missing field \"shape\""},
      {R"({"dtype":"U8","shape":[1]})", "missing field \"data_offsets\""},
      {R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})", "dtype is not a string"},
      {R"({"dtype":"F33","shape":[1],"data_offsets":[0,1]})", "unknown dtype \"F33\""},
      {R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", "shape is not an array"},
      {R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})", "non-integer dimension"},
      {R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", "non-integer dimension"},
      {R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", "negative dimension -1"},
      {R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]})", "too large"},
      {R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]})", "overflows"},
      {R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,1]})", "overflows"},
      {R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", "data_offsets must be [begin, end]"},
      {R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", "data_offsets must be"},
      {R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})", "data_offsets must be"},
      {R"({"dtype":"U8","shape":[1],"data_offsets":"0,1"})", "data_offsets must be"},
      {R"({"dtype":"U8","shape":[0],"data_offsets":[1,0]})", "begin 1 > end 0"},
      {R"({"dtype":"F32","shape":[2],"data_offsets":[0,1]})",
       "shape [2] x F32 (4 bytes) = 8 bytes, but data_offsets [0,1] span 1 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    ExpectError(Raw("{\"x\":" + c.entry + "}", "a"), absl::StatusCode::kInvalidArgument,
                c.fragment);
  }
}

TEST(SafetensorsTest, OffsetsMustTileTheDataBuffer) {
  auto two = [](const std::string& a, const std::string& b) {
    return R"({"a":{"dtype":"U8","shape":[2],"data_offsets":)" + a +
           R"(},"b":{"dtype":"U8","shape":[2],"data_offsets":)" + b + "}}";
  };
  ExpectError(Raw(two("[0,2]", "[1,3]"), "abc"), absl::StatusCode::kInvalidArgument,
              "tensor 'b' data_offsets [1,3] overlap tensor 'a' [0,2]");
  ExpectError(Raw(two("[0,2]", "[0,2]"), "ab"), absl::StatusCode::kInvalidArgument, "overlap");
  ExpectError(Raw(two("[0,2]", "[3,5]"), "abcde"), absl::StatusCode::kInvalidArgument,
              "gap of 1 bytes in the data buffer before tensor 'b'");
  ExpectError(Raw(two("[1,3]", "[3,5]"), "abcde"), absl::StatusCode::kInvalidArgument,
              "gap of 1 bytes in the data buffer before tensor 'a'");
  ExpectError(Raw(two("[0,2]", "[2,4]"), "abcdef"), absl::StatusCode::kInvalidArgument,
              "2 trailing bytes after the last tensor");
  ExpectError(Raw(two("[0,2]", "[2,4]"), "abc"), absl::StatusCode::kDataLoss,
              "tensors need 4 data bytes but the data buffer has only 3");
  ExpectError(Raw("{}", "zz"), absl::StatusCode::kInvalidArgument, "2 trailing bytes");
  // Corrupting a real file's offsets: shift one tensor's end (its shape no longer matches).
  std::string bytes = Bytes(kMqa);
  size_t at = bytes.find("[320,20800]");
  ASSERT_NE(at, std::string::npos);
  std::string corrupt = bytes;
  corrupt.replace(at, 11, "[320,20804]");
  ExpectError(corrupt, absl::StatusCode::kInvalidArgument, "span 20484 bytes");
}

TEST(SafetensorsTest, DuplicateNames) {
  std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  ExpectError(Raw(h, "xy"), absl::StatusCode::kInvalidArgument, "duplicate name 'a'");
  // Duplicate keys inside a nested object are not tensor names; only JSON rules apply.
  std::string nested = R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})";
  ExpectError(Raw(nested), absl::StatusCode::kInvalidArgument, "duplicate name '__metadata__'");
}

TEST(SafetensorsTest, ValidateAndWriteRefuseBadFiles) {
  const testing::ScopedTempDir tmp_dir("safetensors");
  std::string dir = tmp_dir.path();
  std::string path = dir + "/bad.safetensors";
  struct Case {
    StFile file;
    std::string fragment;
  };
  std::vector<Case> cases;
  cases.push_back({StFile{{}, {{"a", StDtype::kF32, {2}, "1234"}}}, "needs 8 bytes but has 4"});
  cases.push_back({StFile{{}, {{"a", StDtype::kU8, {-1}, ""}}}, "negative dimension -1"});
  cases.push_back(
      {StFile{{}, {{"a", StDtype::kU8, {1}, "x"}, {"a", StDtype::kU8, {1}, "y"}}}, "duplicate"});
  cases.push_back({StFile{{}, {{"__metadata__", StDtype::kU8, {}, "x"}}}, "__metadata__"});
  cases.push_back({StFile{{}, {{"\xff", StDtype::kU8, {}, "x"}}}, "not UTF-8"});
  cases.push_back({StFile{{{"k", "\xfe"}}, {}}, "not valid UTF-8"});
  cases.push_back({StFile{{}, {{"a", StDtype::kU8, {1ll << 40, 1ll << 40}, ""}}}, "overflows"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    absl::Status v = ValidateStFile(c.file);
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(v.message()), HasSubstr(c.fragment));
    absl::Status w = WriteSafetensorsFile(path, c.file);
    EXPECT_EQ(w.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(w.message()), HasSubstr(path));
    EXPECT_FALSE(std::filesystem::exists(path));
    SerializeSafetensors(c.file);  // must not crash
  }
}

// Random corruption of a real file never crashes: it parses or yields a clean error.
TEST(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string bytes = Bytes(kMqa);
  std::mt19937 rng(7);
  const size_t header_end = 8 + 2616;
  for (int i = 0; i < 400; ++i) {
    std::string b = bytes;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      size_t at = rng() % (i % 10 == 0 ? 8 : header_end);  // mostly header, sometimes length
      b[at] = static_cast<char>(rng() & 0xff);
    }
    if (i % 3 == 0) b.resize(rng() % b.size());
    absl::StatusOr<StFile> f = ParseSafetensors(b, "fuzz");
    if (!f.ok()) {
      EXPECT_TRUE(f.status().code() == absl::StatusCode::kInvalidArgument ||
                  f.status().code() == absl::StatusCode::kDataLoss)
          << f.status();
      EXPECT_THAT(std::string(f.status().message()), HasSubstr("fuzz: "));
    }
  }
}

TEST(SafetensorsTest, FileSystemErrorsNameThePath) {
  absl::StatusOr<StFile> f = ReadSafetensorsFile("/nonexistent/x.safetensors");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("/nonexistent/x.safetensors"));

  const testing::ScopedTempDir tmp_dir("safetensors");
  std::string dir = tmp_dir.path();
  f = ReadSafetensorsFile(dir);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("is a directory"));
}

}  // namespace
}  // namespace latchkey
