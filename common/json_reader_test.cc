#include "common/json_reader.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(JsonReaderTest, ParseJsonObject) {
  absl::StatusOr<json> ok = ParseJsonObject(R"({"a": 1})", "f.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["a"], 1);
  absl::StatusOr<json> bad = ParseJsonObject("{", "f.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), HasSubstr("f.json: not valid JSON: "));
  bad = ParseJsonObject("[1]", "f.json");
  EXPECT_EQ(Msg(bad.status()), "f.json: not a JSON object but array");
  bad = ParseJsonObject("", "spec");
  EXPECT_THAT(Msg(bad.status()), HasSubstr("spec: not valid JSON"));
}

TEST(JsonReaderTest, PathsAndSources) {
  const json root = json::parse(R"({"m": {"k": "x"}})");
  JsonObjectReader top(root, "");
  EXPECT_EQ(top.Path("m"), "m");
  JsonObjectReader m = top.Child("m", root["m"]);
  EXPECT_EQ(m.Path("k"), "m.k");
  int out = 7;
  absl::Status s = m.Int("k", &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s), "m.k: must be an integer, got \"x\"");
  EXPECT_EQ(out, 7);  // unchanged on error

  JsonObjectReader file(root, "", "dir/config.json");
  EXPECT_EQ(Msg(file.Error("m", "why")), "dir/config.json: m: why");
  EXPECT_EQ(file.Child("m", root["m"]).Path("k"), "dir/config.json: m.k");
}

TEST(JsonReaderTest, IntegersAndBounds) {
  const json root = json::parse(
      R"({"zero": 0, "big": 4294967296, "huge": 18446744073709551615, "neg": -3,
          "half": 2.5, "ten": 10})");
  JsonObjectReader r(root, "s");
  int i = -1;
  EXPECT_EQ(Msg(r.Int("zero", &i, IntBounds{1})), "s.zero: must be >= 1, got 0");
  EXPECT_EQ(Msg(r.Int("big", &i, IntBounds{1})), "s.big: out of range");
  EXPECT_EQ(Msg(r.Int("big", &i, IntBounds{1, 100, "positive"})),
            "s.big: must be positive, got 4294967296");
  EXPECT_EQ(Msg(r.Int("neg", &i, IntBounds{1, 100, "positive"})),
            "s.neg: must be positive, got -3");
  EXPECT_EQ(Msg(r.Int("half", &i)), "s.half: must be an integer, got 2.5");
  int64_t big = 0;
  EXPECT_EQ(Msg(r.Int64("huge", &big)), "s.huge: out of range");
  ASSERT_TRUE(r.Int64("big", &big).ok());
  EXPECT_EQ(big, 4294967296);
  ASSERT_TRUE(r.Int("ten", &i, IntBounds{1}).ok());
  EXPECT_EQ(i, 10);
  ASSERT_TRUE(r.Int("absent", &i, IntBounds{100}).ok());  // absent: unchanged, no bounds check
  EXPECT_EQ(i, 10);
  uint64_t u = 5;
  EXPECT_THAT(Msg(r.Uint64("neg", &u)), HasSubstr("must be a non-negative integer, got -3"));
  ASSERT_TRUE(r.Uint64("huge", &u).ok());
  EXPECT_EQ(u, 18446744073709551615u);
}

TEST(JsonReaderTest, DoublesAndRanges) {
  const json root = json::parse(R"({"p": 1.5, "z": 0, "n": -0.5, "s": "x", "ok": 0.25})");
  JsonObjectReader r(root, "");
  const DoubleRange unit{0.0, false, 1.0, true};
  const DoubleRange positive{0.0, true, std::numeric_limits<double>::infinity(), true};
  const DoubleRange non_negative{0.0, false, std::numeric_limits<double>::infinity(), true};
  double d = 9;
  EXPECT_EQ(Msg(r.Double("p", &d, unit)), "p: must be in [0, 1), got 1.5");
  EXPECT_EQ(Msg(r.Double("z", &d, positive)), "z: must be > 0, got 0");
  EXPECT_EQ(Msg(r.Double("n", &d, non_negative)), "n: must be >= 0, got -0.5");
  EXPECT_EQ(Msg(r.Double("s", &d)), "s: must be a number, got \"x\"");
  EXPECT_EQ(d, 9);
  ASSERT_TRUE(r.Double("ok", &d, unit).ok());
  EXPECT_EQ(d, 0.25);
  ASSERT_TRUE(r.Double("z", &d, non_negative).ok());  // an integer is a number
  EXPECT_EQ(d, 0.0);
  EXPECT_FALSE(CheckDoubleRange("x", std::nan(""), DoubleRange{}).ok());
  EXPECT_FALSE(CheckDoubleRange("x", std::numeric_limits<double>::infinity(), DoubleRange{}).ok());
}

TEST(JsonReaderTest, OtherTypes) {
  const json root = json::parse(
      R"({"b": true, "nb": 1, "s": "str", "ns": 5, "o": {}, "no": [], "long": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"})");
  JsonObjectReader r(root, "");
  bool b = false;
  ASSERT_TRUE(r.Bool("b", &b).ok());
  EXPECT_TRUE(b);
  EXPECT_EQ(Msg(r.Bool("nb", &b)), "nb: must be true or false, got 1");
  std::string s;
  ASSERT_TRUE(r.String("s", &s).ok());
  EXPECT_EQ(s, "str");
  EXPECT_EQ(Msg(r.String("ns", &s)), "ns: must be a string, got 5");
  const json* o = nullptr;
  ASSERT_TRUE(r.Object("o", &o).ok());
  EXPECT_NE(o, nullptr);
  EXPECT_EQ(Msg(r.Object("no", &o)), "no: must be an object, got []");
  ASSERT_TRUE(r.Object("absent", &o).ok());
  EXPECT_EQ(o, nullptr);
  int i = 0;
  // Long values are cut to 40 characters.
  EXPECT_EQ(Msg(r.Int("long", &i)),
            "long: must be an integer, got \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...");
}

TEST(JsonReaderTest, Arrays) {
  const json root = json::parse(
      R"({"ints": [1, 2, 3], "bad_int": [1, "2"], "low": [1, 0], "not": 4, "empty": [],
          "bools": [true, false], "bad_bool": [true, 1], "pair": [0.9, 0.99],
          "short": [0.9], "out": [0.9, 1.0]})");
  JsonObjectReader r(root, "l");
  std::vector<int> ints;
  ASSERT_TRUE(r.IntArray("ints", &ints, IntBounds{1}).ok());
  EXPECT_THAT(ints, ElementsAre(1, 2, 3));
  EXPECT_EQ(Msg(r.IntArray("bad_int", &ints)), "l.bad_int[1]: must be an integer, got \"2\"");
  EXPECT_EQ(Msg(r.IntArray("low", &ints, IntBounds{1})), "l.low[1]: must be >= 1, got 0");
  EXPECT_THAT(Msg(r.IntArray("not", &ints)), HasSubstr("l.not: must be an array of integers"));
  EXPECT_THAT(ints, ElementsAre(1, 2, 3));  // unchanged on error
  ASSERT_TRUE(r.IntArray("empty", &ints).ok());
  EXPECT_TRUE(ints.empty());

  std::vector<bool> bools;
  ASSERT_TRUE(r.BoolArray("bools", &bools).ok());
  EXPECT_THAT(bools, ElementsAre(true, false));
  EXPECT_EQ(Msg(r.BoolArray("bad_bool", &bools)), "l.bad_bool[1]: must be a boolean, got 1");
  EXPECT_THAT(Msg(r.BoolArray("empty", &bools)),
              HasSubstr("l.empty: must be a non-empty array of booleans"));

  const DoubleRange unit{0.0, false, 1.0, true};
  std::vector<double> two(2, 0.0);
  ASSERT_TRUE(r.DoubleArray("pair", &two, unit).ok());
  EXPECT_THAT(two, ElementsAre(0.9, 0.99));
  EXPECT_EQ(Msg(r.DoubleArray("short", &two, unit)),
            "l.short: must be an array of 2 numbers, got [0.9]");
  EXPECT_EQ(Msg(r.DoubleArray("out", &two, unit)), "l.out[1]: must be in [0, 1), got 1");
}

TEST(JsonReaderTest, UnknownKeySuggestion) {
  const json root = json::parse(R"({"n_layr": 2, "N_HEAD": 4})");
  JsonObjectReader r(root, "model", "cfg.json");
  int v = 0;
  ASSERT_TRUE(r.Int("n_layer", &v).ok());  // absent: asked for, so known
  ASSERT_TRUE(r.Int("n_embd", &v).ok());
  ASSERT_TRUE(r.Int("n_head", &v).ok());
  EXPECT_EQ(r.NearestKnownKey("n_layr"), "n_layer");
  EXPECT_EQ(r.NearestKnownKey("N_HEAD"), "n_head");  // case does not count
  EXPECT_EQ(r.NearestKnownKey("vocab"), "");
  // Both misspellings are named, each with its suggestion.
  EXPECT_EQ(Msg(r.RefuseUnknown()),
            "cfg.json: model.N_HEAD: unknown key; did you mean model.n_head?; model.n_layr: "
            "unknown key; did you mean model.n_layer?");
}

// A required key missing because it was misspelt: one error names the key missing and the
// misspelling (transpositions count one edit); every unknown key gets its own suggestion.
TEST(JsonReaderTest, MisspeltKeysAreNamedWithTheKeyMeant) {
  const json root = json::parse(R"({"path_prefx": "c", "spilt": "1", "sed": 3, "zzzz": 1})");
  JsonObjectReader r(root, "data", "spec.json");
  std::string text;
  uint64_t seed = 0;
  ASSERT_TRUE(r.String("split", &text).ok());
  ASSERT_TRUE(r.Uint64("seed", &seed).ok());
  EXPECT_EQ(r.NearestKnownKey("spilt"), "split");  // "il" for "li": one transposition
  EXPECT_EQ(r.NearestKnownKey("sed"), "seed");
  const absl::Status missing = r.Require("path_prefix");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(missing),
            "spec.json: data.path_prefix: required; data.path_prefx: unknown key; did you mean "
            "data.path_prefix?");
  // Several keys may be meant: the nearest misspelling of any of them is named.
  EXPECT_EQ(Msg(r.WithMisspelling(r.Error("path_prefix", "one of path_prefix or blend"),
                                  {"path_prefix", "blend"})),
            "spec.json: data.path_prefix: one of path_prefix or blend; data.path_prefx: unknown "
            "key; did you mean data.path_prefix?");
  // Nothing near: the error as it was.
  EXPECT_EQ(Msg(r.WithMisspelling(r.Error("dtype", "required"), {"dtype"})),
            "spec.json: data.dtype: required");
  EXPECT_EQ(Msg(r.RefuseUnknown()),
            "spec.json: data.path_prefx: unknown key; did you mean data.path_prefix?; data.sed: "
            "unknown key; did you mean data.seed?; data.spilt: unknown key; did you mean "
            "data.split?; data.zzzz: unknown key");
}

TEST(JsonReaderTest, AliasesAndUnknownKeys) {
  const json root = json::parse(R"({"hidden_size": 32, "extra": 1, "more": 2})");
  JsonObjectReader r(root, "");
  EXPECT_STREQ(r.FirstPresent({"n_embd", "hidden_size"}), "hidden_size");
  EXPECT_STREQ(r.FirstPresent({"n_layer", "num_hidden_layers"}), "n_layer");
  EXPECT_THAT(r.UnknownKeys(),
              ElementsAre("extra", "hidden_size", "more"));  // FirstPresent reads nothing
  int e = 0;
  ASSERT_TRUE(r.Int(r.FirstPresent({"n_embd", "hidden_size"}), &e).ok());
  EXPECT_EQ(e, 32);
  EXPECT_EQ(Msg(r.Require("absent")), "absent: required");
  EXPECT_THAT(r.UnknownKeys(), ElementsAre("extra", "more"));
  // Every unknown key is named, not only the first.
  EXPECT_EQ(Msg(r.RefuseUnknown()), "extra: unknown key; more: unknown key");
  std::vector<std::string> warnings;
  r.WarnUnknown(&warnings);
  EXPECT_THAT(warnings, ElementsAre("unknown top-level key 'extra' ignored",
                                    "unknown top-level key 'more' ignored"));
  const json sub = json::parse(R"({"x": 1})");
  warnings.clear();
  r.Child("section", sub).WarnUnknown(&warnings);
  EXPECT_THAT(warnings, ElementsAre("unknown key 'section.x' ignored"));
  EXPECT_TRUE(r.Child("section", sub).RefuseUnknown().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latchkey
