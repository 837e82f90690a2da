// Reading user-written JSON (the job spec, an HF config.json) into C++ values, field by field,
// with errors that name the field and the reason:
//
//   INVALID_ARGUMENT "[<source>: ]<field.path>: <reason>", e.g.
//     "model.n_layer: must be >= 1, got 0"           (job spec: no source)
//     "ckpt/config.json: n_head: must be an integer, got \"8\""
//
// Usage: ParseJsonObject() the text, wrap the root in a JsonObjectReader, read each key with the
// typed readers (Int, Double, String, ...), descend with Child(), and finish with
// RefuseUnknown() or WarnUnknown() for the keys nobody read. Every typed reader checks the JSON
// type before converting, so no nlohmann exception escapes a reader.
//
// Thread-safety: a JsonObjectReader is not thread-safe (it records which keys were read); use
// one per thread. The free functions are reentrant.
// Lifetime: a reader refers to the JSON object it was given, which must outlive it.
#ifndef LATCHKEY_COMMON_JSON_READER_H_
#define LATCHKEY_COMMON_JSON_READER_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace latchkey {

// Parses `text` as one JSON object. INVALID_ARGUMENT "<source>: not valid JSON: <detail>" or
// "<source>: not a JSON object but <type>" (e.g. "array").
absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view text, absl::string_view source);

// A value as an error message shows it: its JSON text on one line, cut to at most 40 characters.
std::string DescribeJson(const nlohmann::json& value);

// Inclusive bounds on an integer field. A value outside them is refused with
//   "must be <wording>, got <value>"       when `wording` is set (e.g. "positive");
//   "must be >= <min>, got <value>"        below min otherwise;
//   "out of range"                         above max otherwise.
struct IntBounds {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  const char* wording = nullptr;  // static storage
};

// A range of finite doubles; each end is open or closed, `hi` may be +infinity. Refused with
// "must be in [lo, hi), got x", or "must be >= lo, got x" / "must be > lo, got x" when hi is
// infinite. A non-finite value is always refused.
struct DoubleRange {
  double lo = -std::numeric_limits<double>::infinity();
  bool lo_open = true;
  double hi = std::numeric_limits<double>::infinity();
  bool hi_open = true;
};
// The error CheckDoubleRange gives for `x` at `path` (OK when x is inside `range`).
absl::Status CheckDoubleRange(const std::string& path, double x, const DoubleRange& range);

// The INVALID_ARGUMENT every reader returns: "<path>: <reason>".
absl::Status FieldError(absl::string_view path, absl::string_view reason);

// One JSON object read key by key. Remembers the keys asked for (Get and every typed reader), so
// the rest can be refused or reported. Each typed reader leaves *out unchanged when the key is
// absent; a present key of the wrong type or out of bounds is an error naming Path(key).
class JsonObjectReader {
 public:
  // REQUIRES: obj.is_object(). `path` is the object's own field path ("" for the root, "model",
  // "optimizer.params"); `source`, when not empty, prefixes every error (a file name).
  JsonObjectReader(const nlohmann::json& obj, std::string path, std::string source = "");

  // "<path>.<key>" ("<key>" at the root), prefixed by "<source>: " when there is a source.
  std::string Path(absl::string_view key) const;
  // FieldError(Path(key), reason).
  absl::Status Error(absl::string_view key, absl::string_view reason) const;

  // The value under `key` (nullptr when absent). Marks the key as read.
  const nlohmann::json* Get(absl::string_view key);
  // The first of `keys` present in the object (aliases), or the first of `keys` when none is.
  // Marks nothing. REQUIRES: `keys` not empty.
  const char* FirstPresent(std::initializer_list<const char*> keys) const;
  // "<path.key>: required" when absent; when an unread key of the object is a misspelling of it
  // (as NearestKnownKey measures), "; <path.that key>: unknown key; did you mean <path.key>?"
  // follows (WithMisspelling).
  absl::Status Require(absl::string_view key);
  // `error` (the refusal of a required key, or of one of several, that is absent) with
  // "; <path.typo>: unknown key; did you mean <path.key>?" appended when an unread key of the
  // object is a misspelling of one of `keys` (the nearest such pair); else `error` unchanged.
  absl::Status WithMisspelling(absl::Status error,
                               std::initializer_list<absl::string_view> keys) const;

  // An integer within `bounds` (a float such as 2.0 is not an integer).
  absl::Status Int64(absl::string_view key, int64_t* out, IntBounds bounds = {});
  // As Int64, with bounds.max further capped at INT_MAX ("out of range" above it unless
  // bounds.wording is set).
  absl::Status Int(absl::string_view key, int* out, IntBounds bounds = {});
  // An unsigned integer ("must be a non-negative integer" otherwise).
  absl::Status Uint64(absl::string_view key, uint64_t* out);
  // Any JSON number within `range`.
  absl::Status Double(absl::string_view key, double* out, const DoubleRange& range = {});
  absl::Status Bool(absl::string_view key, bool* out);
  absl::Status String(absl::string_view key, std::string* out);
  // *out = the object under `key`, or nullptr when absent.
  absl::Status Object(absl::string_view key, const nlohmann::json** out);
  // An array of integers within `bounds`; elements are named "<key>[i]". Replaces *out.
  absl::Status IntArray(absl::string_view key, std::vector<int>* out, IntBounds bounds = {});
  // A non-empty array of booleans; elements are named "<key>[i]". Replaces *out.
  absl::Status BoolArray(absl::string_view key, std::vector<bool>* out);
  // An array of exactly out->size() numbers, each within `range`. Replaces the elements of *out.
  absl::Status DoubleArray(absl::string_view key, std::vector<double>* out,
                           const DoubleRange& range = {});

  // A reader of `obj` (the object under `key`, from Object()), with path Path(key) and this
  // reader's source.
  JsonObjectReader Child(absl::string_view key, const nlohmann::json& obj) const;

  // Keys present but never asked for, in key order.
  std::vector<std::string> UnknownKeys() const;
  // "unknown key" naming every unread key, if any ("<path.k1>: unknown key; <path.k2>: unknown
  // key"); each that a key this reader asked for (and the object lacks) is a few edits away from
  // reads "unknown key; did you mean <path.known>?".
  absl::Status RefuseUnknown() const;
  // The key asked for but absent that is nearest to `key` (case-insensitive edit distance with
  // transpositions, at most a third of its length rounded up, 1..3), or "" when none is that near.
  std::string NearestKnownKey(absl::string_view key) const;
  // Appends "unknown top-level key 'k' ignored" (root) or "unknown key 'path.k' ignored".
  void WarnUnknown(std::vector<std::string>* warnings) const;

 private:
  // Path(key) without the source prefix.
  std::string FieldPath(absl::string_view key) const;
  // The integer checks shared by Int64, Int and IntArray; `path` names the value.
  absl::Status CheckInt(const std::string& path, const nlohmann::json& v, IntBounds bounds,
                        int64_t* out) const;

  const nlohmann::json& obj_;
  std::string path_;
  std::string source_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JSON_READER_H_
