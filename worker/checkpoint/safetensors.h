// Torch-free reader/writer of the safetensors format (docs/checkpoints.md): bytes <-> tensors
// and header validation.
// The file operations live in files.h; ReadSafetensorsFile/WriteSafetensorsFile join the two.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON (may be padded with trailing
// spaces), then the packed data buffer. Each tensor entry is
//   "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
// with offsets relative to the data buffer start; the entries tile the buffer exactly. An
// optional "__metadata__" entry maps strings to strings.
//
// Errors never escape as exceptions: every function returns absl::Status(Or).
//   DATA_LOSS        the bytes end early (truncated file, header or data buffer short).
//   INVALID_ARGUMENT anything else malformed (bad JSON, bad entry, gaps/overlaps, trailing bytes).
//   NOT_FOUND / INTERNAL for file system problems (naming the path; see files.h).
// Messages start with the source name (the file path, or "<memory>").
//
// Thread-safety: all functions are reentrant; StFile/StTensor are plain value types.
#ifndef LATCHKEY_WORKER_CHECKPOINT_SAFETENSORS_H_
#define LATCHKEY_WORKER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latchkey {

// Every dtype the safetensors format defines.
enum class StDtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

const char* StDtypeName(StDtype d);  // "F32", "BF16", "F8_E4M3", ...
std::optional<StDtype> ParseStDtype(absl::string_view name);
size_t StDtypeSize(StDtype d);  // bytes per element

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  std::string data;            // raw little-endian bytes, size = NumElements() * dtype size

  // Product of the dims (1 for a scalar). Only meaningful for a validated tensor.
  int64_t NumElements() const;
};

struct StFile {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<StTensor> tensors;                // sorted by name (Parse guarantees it)

  // The tensor called `name`, or nullptr. Binary search: `tensors` must be sorted by name.
  const StTensor* Find(absl::string_view name) const;
};

// Parses a whole safetensors file held in memory. `source` names it in error messages.
absl::StatusOr<StFile> ParseSafetensors(absl::string_view bytes,
                                        absl::string_view source = "<memory>");
// Reads and parses `path`. NOT_FOUND (naming the path) when it does not exist.
absl::StatusOr<StFile> ReadSafetensorsFile(const std::string& path);

// Checks what Serialize needs: unique non-empty names (not "__metadata__"), valid UTF-8 in
// names and metadata, non-negative dims, data size = element count × dtype size.
absl::Status ValidateStFile(const StFile& file);

// Serializes with tensors laid out in name order (whatever the order of `file.tensors`) and
// the header padded with spaces to a multiple of 8 bytes. Precondition: ValidateStFile(file)
// is OK; otherwise the output is unspecified (it never crashes), and Parse will reject it.
std::string SerializeSafetensors(const StFile& file);
// Validates, serializes and writes atomically (WriteFileAtomically, files.h). INVALID_ARGUMENT
// "<path>: not writing: ..." (nothing written) when ValidateStFile refuses `file`.
absl::Status WriteSafetensorsFile(const std::string& path, const StFile& file);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_SAFETENSORS_H_
