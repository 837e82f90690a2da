#include "common/json_reader.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latchkey {

using json = nlohmann::json;

absl::StatusOr<json> ParseJsonObject(absl::string_view text, absl::string_view source) {
  // Deeper values are dropped while parsing and the text refused: printing or walking one
  // recurses once per level, and a hostile spec could exhaust the stack.
  constexpr int kMaxDepth = 64;
  bool too_deep = false;
  json::parser_callback_t limit_depth = [&too_deep](int depth, json::parse_event_t event, json&) {
    if (depth > kMaxDepth &&
        (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)) {
      too_deep = true;
      return false;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), limit_depth);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": nested deeper than ", kMaxDepth, " levels"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object but ", root.type_name()));
  }
  return root;
}

std::string DescribeJson(const json& value) {
  // Replace invalid UTF-8 rather than throw: the text only goes into a message.
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

absl::Status FieldError(absl::string_view path, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", reason));
}

absl::Status CheckDoubleRange(const std::string& path, double x, const DoubleRange& r) {
  const bool ok =
      std::isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
  if (ok) return absl::OkStatus();
  std::string bound;
  if (std::isinf(r.hi)) {
    bound = absl::StrCat(r.lo_open ? "> " : ">= ", r.lo);
  } else {
    bound = absl::StrCat("in ", r.lo_open ? "(" : "[", r.lo, ", ", r.hi, r.hi_open ? ")" : "]");
  }
  return FieldError(path, absl::StrCat("must be ", bound, ", got ", x));
}

JsonObjectReader::JsonObjectReader(const json& obj, std::string path, std::string source)
    : obj_(obj), path_(std::move(path)), source_(std::move(source)) {}

std::string JsonObjectReader::FieldPath(absl::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
}

std::string JsonObjectReader::Path(absl::string_view key) const {
  return source_.empty() ? FieldPath(key) : absl::StrCat(source_, ": ", FieldPath(key));
}

absl::Status JsonObjectReader::Error(absl::string_view key, absl::string_view reason) const {
  return FieldError(Path(key), reason);
}

const json* JsonObjectReader::Get(absl::string_view key) {
  std::string k(key);
  auto it = obj_.find(k);
  used_.insert(std::move(k));
  return it == obj_.end() ? nullptr : &*it;
}

const char* JsonObjectReader::FirstPresent(std::initializer_list<const char*> keys) const {
  for (const char* k : keys) {
    if (obj_.contains(k)) return k;
  }
  return *keys.begin();
}

namespace {

// Edit distance with adjacent transpositions (optimal string alignment), case-insensitive:
// "stpes" is one edit from "steps". Keys are short, so the full table is cheap.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  const auto same = [](char x, char y) { return absl::ascii_tolower(x) == absl::ascii_tolower(y); };
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// How far a misspelling may be from the key meant: a third of its length rounded up, 1..3.
size_t SuggestionLimit(absl::string_view key) {
  return std::max<size_t>(1, std::min<size_t>(3, (key.size() + 2) / 3));
}

}  // namespace

absl::Status JsonObjectReader::Require(absl::string_view key) {
  if (Get(key) != nullptr) return absl::OkStatus();
  return WithMisspelling(Error(key, "required"), {key});
}

absl::Status JsonObjectReader::WithMisspelling(
    absl::Status error, std::initializer_list<absl::string_view> keys) const {
  // A required key that is missing because it was misspelt: the refusal names both the key
  // missing and the misspelling the user wrote in its place.
  std::string nearest_unknown;
  std::string meant;
  size_t best = std::numeric_limits<size_t>::max();
  for (const std::string& present : UnknownKeys()) {
    for (absl::string_view key : keys) {
      const size_t d = EditDistance(present, key);
      if (d <= SuggestionLimit(present) && d < best) {
        best = d;
        nearest_unknown = present;
        meant = std::string(key);
      }
    }
  }
  if (nearest_unknown.empty()) return error;
  return absl::Status(error.code(),
                      absl::StrCat(error.message(), "; ", FieldPath(nearest_unknown),
                                   ": unknown key; did you mean ", FieldPath(meant), "?"));
}

absl::Status JsonObjectReader::CheckInt(const std::string& path, const json& v, IntBounds b,
                                        int64_t* out) const {
  if (!v.is_number_integer()) {
    return FieldError(path, "must be an integer, got " + DescribeJson(v));
  }
  const bool too_big =
      v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t x = too_big ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
  if (too_big || x < b.min || x > b.max) {
    if (b.wording != nullptr) {
      return FieldError(path, absl::StrCat("must be ", b.wording, ", got ", DescribeJson(v)));
    }
    if (!too_big && x < b.min) {
      return FieldError(path, absl::StrCat("must be >= ", b.min, ", got ", x));
    }
    return FieldError(path, "out of range");
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status JsonObjectReader::Int64(absl::string_view key, int64_t* out, IntBounds bounds) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  return CheckInt(Path(key), *v, bounds, out);
}

absl::Status JsonObjectReader::Int(absl::string_view key, int* out, IntBounds bounds) {
  bounds.max = std::min<int64_t>(bounds.max, std::numeric_limits<int>::max());
  int64_t x = *out;
  LK_RETURN_IF_ERROR(Int64(key, &x, bounds));
  *out = static_cast<int>(x);
  return absl::OkStatus();
}

absl::Status JsonObjectReader::Uint64(absl::string_view key, uint64_t* out) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_unsigned()) {
    return Error(key, "must be a non-negative integer, got " + DescribeJson(*v));
  }
  *out = v->get<uint64_t>();
  return absl::OkStatus();
}

absl::Status JsonObjectReader::Double(absl::string_view key, double* out,
                                      const DoubleRange& range) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Error(key, "must be a number, got " + DescribeJson(*v));
  const double x = v->get<double>();
  LK_RETURN_IF_ERROR(CheckDoubleRange(Path(key), x, range));
  *out = x;
  return absl::OkStatus();
}

absl::Status JsonObjectReader::Bool(absl::string_view key, bool* out) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return Error(key, "must be true or false, got " + DescribeJson(*v));
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonObjectReader::String(absl::string_view key, std::string* out) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return Error(key, "must be a string, got " + DescribeJson(*v));
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonObjectReader::Object(absl::string_view key, const json** out) {
  const json* v = Get(key);
  *out = v;
  if (v != nullptr && !v->is_object()) {
    return Error(key, "must be an object, got " + DescribeJson(*v));
  }
  return absl::OkStatus();
}

absl::Status JsonObjectReader::IntArray(absl::string_view key, std::vector<int>* out,
                                        IntBounds bounds) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array()) return Error(key, "must be an array of integers, got " + DescribeJson(*v));
  bounds.max = std::min<int64_t>(bounds.max, std::numeric_limits<int>::max());
  std::vector<int> values;
  for (size_t i = 0; i < v->size(); ++i) {
    int64_t x = 0;
    LK_RETURN_IF_ERROR(CheckInt(absl::StrCat(Path(key), "[", i, "]"), (*v)[i], bounds, &x));
    values.push_back(static_cast<int>(x));
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonObjectReader::BoolArray(absl::string_view key, std::vector<bool>* out) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array() || v->empty()) {
    return Error(key, "must be a non-empty array of booleans, got " + DescribeJson(*v));
  }
  std::vector<bool> values;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_boolean()) {
      return FieldError(absl::StrCat(Path(key), "[", i, "]"),
                        "must be a boolean, got " + DescribeJson((*v)[i]));
    }
    values.push_back((*v)[i].get<bool>());
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonObjectReader::DoubleArray(absl::string_view key, std::vector<double>* out,
                                           const DoubleRange& range) {
  const json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  bool numbers = v->is_array() && v->size() == out->size();
  for (size_t i = 0; numbers && i < v->size(); ++i) numbers = (*v)[i].is_number();
  if (!numbers) {
    return Error(
        key, absl::StrCat("must be an array of ", out->size(), " numbers, got ", DescribeJson(*v)));
  }
  std::vector<double> values;
  for (size_t i = 0; i < v->size(); ++i) {
    const double x = (*v)[i].get<double>();
    LK_RETURN_IF_ERROR(CheckDoubleRange(absl::StrCat(Path(key), "[", i, "]"), x, range));
    values.push_back(x);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

JsonObjectReader JsonObjectReader::Child(absl::string_view key, const json& obj) const {
  return JsonObjectReader(obj, FieldPath(key), source_);
}

std::vector<std::string> JsonObjectReader::UnknownKeys() const {
  std::vector<std::string> keys;
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (used_.count(it.key()) == 0) keys.push_back(it.key());
  }
  return keys;
}

std::string JsonObjectReader::NearestKnownKey(absl::string_view key) const {
  // A typo is a few edits away; a key that shares nothing with any known one gets no guess.
  const size_t limit = SuggestionLimit(key);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& known : used_) {
    if (obj_.contains(known)) continue;  // present and read: the user wrote it already
    const size_t d = EditDistance(key, known);
    if (d < best_distance) {
      best = known;
      best_distance = d;
    }
  }
  return best;
}

absl::Status JsonObjectReader::RefuseUnknown() const {
  const std::vector<std::string> keys = UnknownKeys();
  if (keys.empty()) return absl::OkStatus();
  // Every unknown key is named, each with the known key nearest to it (the keys asked for are
  // the ones this object knows, so the nearest is the likely intent).
  std::string reasons;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string nearest = NearestKnownKey(keys[i]);
    const std::string reason =
        nearest.empty() ? std::string("unknown key")
                        : absl::StrCat("unknown key; did you mean ", FieldPath(nearest), "?");
    // The first key's path starts the message (Error below); the others name their own.
    if (i == 0) {
      reasons = reason;
    } else {
      absl::StrAppend(&reasons, "; ", FieldPath(keys[i]), ": ", reason);
    }
  }
  return Error(keys.front(), reasons);
}

void JsonObjectReader::WarnUnknown(std::vector<std::string>* warnings) const {
  for (const std::string& k : UnknownKeys()) {
    warnings->push_back(path_.empty() ? absl::StrCat("unknown top-level key '", k, "' ignored")
                                      : absl::StrCat("unknown key '", FieldPath(k), "' ignored"));
  }
}

}  // namespace latchkey
