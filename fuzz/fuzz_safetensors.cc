// libFuzzer target: ParseSafetensors on arbitrary bytes. A file that parses and validates must
// serialize and parse back to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "worker/checkpoint/safetensors.h"

namespace {

bool SameFile(const latchkey::StFile& a, const latchkey::StFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const latchkey::StTensor& x = a.tensors[i];
    const latchkey::StTensor& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.data != y.data) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<latchkey::StFile> file = latchkey::ParseSafetensors(bytes, "fuzz.safetensors");
  if (!file.ok()) {
    if (file.status().message().empty()) {
      std::fprintf(stderr, "ParseSafetensors refused with an empty message\n");
      std::abort();
    }
    return 0;
  }
  for (const latchkey::StTensor& t : file->tensors) {
    (void)file->Find(t.name);
    (void)t.NumElements();
  }
  if (!latchkey::ValidateStFile(*file).ok()) return 0;
  const std::string out = latchkey::SerializeSafetensors(*file);
  absl::StatusOr<latchkey::StFile> again = latchkey::ParseSafetensors(out, "again.safetensors");
  if (!again.ok()) {
    std::fprintf(stderr, "SerializeSafetensors output does not re-parse: %s\n",
                 again.status().ToString().c_str());
    std::abort();
  }
  if (!SameFile(*file, *again)) {
    std::fprintf(stderr, "SerializeSafetensors round trip changed the file\n");
    std::abort();
  }
  return 0;
}
