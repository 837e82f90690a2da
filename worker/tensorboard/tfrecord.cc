#include "worker/tensorboard/tfrecord.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/tensorboard/crc32c.h"

namespace latchkey::tensorboard {
namespace {

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string FrameRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLe(&out, data.size(), 8);
  PutLe(&out, MaskedCrc32c(out.data(), 8), 4);
  out.append(data.data(), data.size());
  PutLe(&out, MaskedCrc32c(data.data(), data.size()), 4);
  return out;
}

absl::Status ReadRecords(absl::string_view bytes, std::vector<std::string>* records,
                         bool* truncated) {
  *truncated = false;
  size_t off = 0;
  while (off < bytes.size()) {
    if (bytes.size() - off < 12) {
      *truncated = true;
      return absl::OkStatus();
    }
    const char* h = bytes.data() + off;
    const uint64_t len = GetLe(h, 8);
    if (GetLe(h + 8, 4) != MaskedCrc32c(h, 8)) {
      return absl::DataLossError(absl::StrCat("record at offset ", off, ": length CRC mismatch"));
    }
    if (bytes.size() - off - 12 < len + 4) {
      *truncated = true;
      return absl::OkStatus();
    }
    const char* d = h + 12;
    if (GetLe(d + len, 4) != MaskedCrc32c(d, len)) {
      return absl::DataLossError(absl::StrCat("record at offset ", off, ": data CRC mismatch"));
    }
    records->emplace_back(d, len);
    off += 12 + len + 4;
  }
  return absl::OkStatus();
}

}  // namespace latchkey::tensorboard
