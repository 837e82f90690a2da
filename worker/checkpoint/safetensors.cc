#include "worker/checkpoint/safetensors.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"

namespace latchkey {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // 100 MB, as the Rust reader
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeInfo {
  StDtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::kBool, "BOOL", 1},      {StDtype::kU8, "U8", 1},          {StDtype::kI8, "I8", 1},
    {StDtype::kF8E5M2, "F8_E5M2", 1}, {StDtype::kF8E4M3, "F8_E4M3", 1}, {StDtype::kI16, "I16", 2},
    {StDtype::kU16, "U16", 2},        {StDtype::kF16, "F16", 2},        {StDtype::kBF16, "BF16", 2},
    {StDtype::kI32, "I32", 4},        {StDtype::kU32, "U32", 4},        {StDtype::kF32, "F32", 4},
    {StDtype::kF64, "F64", 8},        {StDtype::kI64, "I64", 8},        {StDtype::kU64, "U64", 8},
};

const DtypeInfo& Info(StDtype d) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == d) return info;
  }
  return kDtypes[0];  // unreachable for a valid enum value
}

std::string ShapeString(const json& shape) { return shape.dump(); }

// Element count of `shape` times `elem_size`, or nullopt on overflow past INT64_MAX.
std::optional<uint64_t> ByteSize(const std::vector<int64_t>& shape, size_t elem_size) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t count = 1;
  for (int64_t d : shape) {
    uint64_t next;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &next) || next > kMax) {
      return std::nullopt;
    }
    count = next;
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(elem_size), &bytes) || bytes > kMax) {
    return std::nullopt;
  }
  return bytes;
}

// A JSON string literal for `s`; nullopt when `s` is not valid UTF-8.
std::optional<std::string> JsonString(const std::string& s) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

struct Entry {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Parses one tensor entry of the header (everything but the tiling check).
absl::Status ParseEntry(absl::string_view source, const std::string& name, const json& value,
                        Entry* out) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", name, "': ", what));
  };
  if (!value.is_object()) return bad(absl::StrCat("entry is not an object: ", value.dump()));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) return bad(absl::StrCat("missing field \"", field, "\""));
  }
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) return bad(absl::StrCat("dtype is not a string: ", dtype.dump()));
  std::optional<StDtype> parsed = ParseStDtype(dtype.get_ref<const std::string&>());
  if (!parsed) return bad(absl::StrCat("unknown dtype ", dtype.dump()));

  const json& shape = value["shape"];
  if (!shape.is_array()) return bad(absl::StrCat("shape is not an array: ", shape.dump()));
  std::vector<int64_t> dims;
  for (const json& d : shape) {
    if (d.is_number_unsigned()) {
      if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat("dimension ", d.dump(), " is too large"));
      }
      dims.push_back(d.get<int64_t>());
    } else if (d.is_number_integer()) {
      return bad(absl::StrCat("negative dimension ", d.dump(), " in shape ", ShapeString(shape)));
    } else {
      return bad(absl::StrCat("shape has a non-integer dimension: ", ShapeString(shape)));
    }
  }

  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return bad(absl::StrCat("data_offsets must be [begin, end] with non-negative integers, got ",
                            offsets.dump()));
  }
  uint64_t begin = offsets[0].get<uint64_t>();
  uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) {
    return bad(absl::StrCat("data_offsets begin ", begin, " > end ", end));
  }
  size_t elem = StDtypeSize(*parsed);
  std::optional<uint64_t> bytes = ByteSize(dims, elem);
  if (!bytes) {
    return bad(absl::StrCat("element count of shape ", ShapeString(shape), " overflows"));
  }
  if (*bytes != end - begin) {
    return bad(absl::StrCat("shape ", ShapeString(shape), " x ", StDtypeName(*parsed), " (", elem,
                            " bytes) = ", *bytes, " bytes, but data_offsets [", begin, ",", end,
                            "] span ", end - begin, " bytes"));
  }
  *out = Entry{name, *parsed, std::move(dims), begin, end};
  return absl::OkStatus();
}

// Checks that the entries tile [0, data_size) exactly.
absl::Status CheckTiling(absl::string_view source, std::vector<const Entry*> entries,
                         uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : entries) {
    if (e->begin < pos) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", e->name, "' data_offsets [", e->begin, ",", e->end,
                       "] overlap tensor '", prev->name, "' [", prev->begin, ",", prev->end, "]"));
    }
    if (e->begin > pos) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": gap of ", e->begin - pos, " bytes in the data buffer before tensor '", e->name,
          "' (data_offsets begin ", e->begin, ", expected ", pos, ")"));
    }
    pos = e->end;
    prev = e;
  }
  if (pos > data_size) {
    return absl::DataLossError(absl::StrCat(source, ": tensors need ", pos,
                                            " data bytes but the data buffer has only ", data_size,
                                            " (truncated file?)"));
  }
  if (pos < data_size) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", data_size - pos,
                                                   " trailing bytes after the last tensor (data "
                                                   "buffer is ",
                                                   data_size, " bytes, tensors end at ", pos, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* StDtypeName(StDtype d) { return Info(d).name; }
size_t StDtypeSize(StDtype d) { return Info(d).size; }

std::optional<StDtype> ParseStDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

int64_t StTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const StTensor* StFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const StTensor& t, absl::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<StFile> ParseSafetensors(absl::string_view bytes, absl::string_view source) {
  if (bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat(source, ": file is ", bytes.size(),
                                            " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": header length ", n, " exceeds the ",
                                                   kMaxHeaderBytes,
                                                   "-byte limit (corrupt header length?)"));
  }
  if (n > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat(source, ": header length ", n, " but only ",
                                            bytes.size() - 8,
                                            " bytes follow the length (truncated file?)"));
  }
  absl::string_view header = bytes.substr(8, n);
  absl::string_view data = bytes.substr(8 + n);

  json root;
  std::string duplicate;
  // A valid header nests 3 levels ({name: {shape: [...]}}); deeper values are dropped while
  // parsing and the header refused, as printing one in a message recurses once per level.
  constexpr int kMaxDepth = 8;
  bool too_deep = false;
  try {
    json::parser_callback_t cb = [&duplicate, &too_deep, seen = std::set<std::string>()](
                                     int depth, json::parse_event_t event, json& parsed) mutable {
      if (depth > kMaxDepth && (event == json::parse_event_t::object_start ||
                                event == json::parse_event_t::array_start)) {
        too_deep = true;
        return false;
      }
      if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    };
    root = json::parse(header.begin(), header.end(), cb);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header is not valid JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header nested deeper than ", kMaxDepth, " levels"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header is not a JSON object but ", root.type_name()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": duplicate name '", duplicate, "' in the header"));
  }

  StFile file;
  std::vector<Entry> entries;
  entries.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": __metadata__ is not an object: ", value.dump()));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": __metadata__ value for '", mk,
                                                         "' is not a string: ", mv.dump()));
        }
        file.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    Entry entry;
    LK_RETURN_IF_ERROR(ParseEntry(source, key, value, &entry));
    entries.push_back(std::move(entry));
  }

  std::vector<const Entry*> ptrs;
  for (const Entry& e : entries) ptrs.push_back(&e);
  LK_RETURN_IF_ERROR(CheckTiling(source, std::move(ptrs), data.size()));

  // json objects iterate in key order, so `entries` (and the tensors) are sorted by name.
  file.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    StTensor t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data = std::string(data.substr(e.begin, e.end - e.begin));
    file.tensors.push_back(std::move(t));
  }
  return file;
}

absl::StatusOr<StFile> ReadSafetensorsFile(const std::string& path) {
  LK_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  return ParseSafetensors(bytes, path);
}

absl::Status ValidateStFile(const StFile& file) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
  };
  for (const auto& [k, v] : file.metadata) {
    if (!JsonString(k) || !JsonString(v)) {
      return bad(absl::StrCat("__metadata__ entry '", k, "' is not valid UTF-8"));
    }
  }
  std::set<absl::string_view> names;
  for (const StTensor& t : file.tensors) {
    if (t.name == kMetadataKey) return bad("a tensor may not be called __metadata__");
    if (!JsonString(t.name)) return bad(absl::StrCat("tensor name '", t.name, "' is not UTF-8"));
    if (!names.insert(t.name).second) return bad(absl::StrCat("duplicate tensor '", t.name, "'"));
    for (int64_t d : t.shape) {
      if (d < 0) return bad(absl::StrCat("tensor '", t.name, "' has a negative dimension ", d));
    }
    std::optional<uint64_t> bytes = ByteSize(t.shape, StDtypeSize(t.dtype));
    if (!bytes) return bad(absl::StrCat("tensor '", t.name, "' element count overflows"));
    if (*bytes != t.data.size()) {
      return bad(absl::StrCat("tensor '", t.name, "' [", absl::StrJoin(t.shape, ","), "] ",
                              StDtypeName(t.dtype), " needs ", *bytes, " bytes but has ",
                              t.data.size()));
    }
  }
  return absl::OkStatus();
}

std::string SerializeSafetensors(const StFile& file) {
  std::vector<const StTensor*> order;
  order.reserve(file.tensors.size());
  for (const StTensor& t : file.tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const StTensor* a, const StTensor* b) { return a->name < b->name; });

  // Written by hand (not json::dump) to keep the field order of the reference writers
  // (dtype, shape, data_offsets): a fixture read and written again comes out byte-identical.
  auto quote = [](const std::string& s) {
    return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  std::string header = "{";
  if (!file.metadata.empty()) {
    absl::StrAppend(&header, "\"", kMetadataKey, "\":{");
    bool first = true;
    for (const auto& [k, v] : file.metadata) {
      absl::StrAppend(&header, first ? "" : ",", quote(k), ":", quote(v));
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const StTensor* t : order) {
    if (header.size() > 1) header += ",";
    uint64_t end = offset + t->data.size();
    absl::StrAppend(&header, quote(t->name), ":{\"dtype\":\"", StDtypeName(t->dtype),
                    "\",\"shape\":[", absl::StrJoin(t->shape, ","), "],\"data_offsets\":[", offset,
                    ",", end, "]}");
    offset = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  for (const StTensor* t : order) out += t->data;
  return out;
}

absl::Status WriteSafetensorsFile(const std::string& path, const StFile& file) {
  absl::Status valid = ValidateStFile(file);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not writing: ", valid.message()));
  }
  return WriteFileAtomically(path, SerializeSafetensors(file));
}

}  // namespace latchkey
