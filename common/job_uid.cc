#include "common/job_uid.h"

#include <cstdint>
#include <random>

namespace latchkey {

std::string NewJobUid() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string out;
  out.reserve(kJobUidDigits);
  while (static_cast<int>(out.size()) < kJobUidDigits) {
    uint32_t bits = rd();
    for (int i = 0; i < 8 && static_cast<int>(out.size()) < kJobUidDigits; ++i, bits >>= 4) {
      out.push_back(kHex[bits & 15]);
    }
  }
  return out;
}

bool IsJobUid(absl::string_view uid) {
  if (uid.size() < 8 || uid.size() > 64) return false;
  for (char c : uid) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace latchkey
