// Test helper: writes Megatron .idx/.bin pairs byte by byte (the layout of megatron_index.h), so
// tests can make valid datasets and corrupt exactly one field. Header-only, test code only.
#ifndef LATCHKEY_WORKER_DATA_MEGATRON_TEST_UTIL_H_
#define LATCHKEY_WORKER_DATA_MEGATRON_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace latchkey::testing {

struct MegatronFiles {
  std::string idx;
  std::string bin;
};

// Sequences of ids in dtype `code` (1..8 as Megatron numbers them); document indices `docs`
// (default: one document per sequence, 0..n).
inline MegatronFiles MakeMegatronFiles(int code, const std::vector<std::vector<int64_t>>& seqs,
                                       std::vector<int64_t> docs = {}) {
  const int size = code == 1 || code == 2   ? 1
                   : code == 3 || code == 8 ? 2
                   : code == 4 || code == 7 ? 4
                                            : 8;
  MegatronFiles f;
  auto put = [](std::string* s, const void* p, size_t n) {
    s->append(static_cast<const char*>(p), n);
  };
  f.idx.append("MMIDIDX\0\0", 9);
  const uint64_t version = 1, n = seqs.size();
  if (docs.empty()) {
    for (uint64_t i = 0; i <= n; ++i) docs.push_back(static_cast<int64_t>(i));
  }
  const uint64_t nd = docs.size();
  const uint8_t c = static_cast<uint8_t>(code);
  put(&f.idx, &version, 8);
  put(&f.idx, &c, 1);
  put(&f.idx, &n, 8);
  put(&f.idx, &nd, 8);
  for (const auto& s : seqs) {
    const int32_t len = static_cast<int32_t>(s.size());
    put(&f.idx, &len, 4);
  }
  int64_t ptr = 0;
  for (const auto& s : seqs) {
    put(&f.idx, &ptr, 8);
    ptr += static_cast<int64_t>(s.size()) * size;
  }
  for (int64_t d : docs) put(&f.idx, &d, 8);
  for (const auto& s : seqs) {
    for (int64_t v : s) {
      unsigned char b[8];
      if (code == 6) {
        const double x = static_cast<double>(v);
        std::memcpy(b, &x, 8);
      } else if (code == 7) {
        const float x = static_cast<float>(v);
        std::memcpy(b, &x, 4);
      } else {
        std::memcpy(b, &v, 8);  // little-endian: the low bytes are the narrow value
      }
      put(&f.bin, b, static_cast<size_t>(size));
    }
  }
  return f;
}

inline void WriteMegatronFiles(const std::string& prefix, const MegatronFiles& f) {
  std::ofstream(prefix + ".idx", std::ios::binary | std::ios::trunc) << f.idx;
  std::ofstream(prefix + ".bin", std::ios::binary | std::ios::trunc) << f.bin;
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_WORKER_DATA_MEGATRON_TEST_UTIL_H_
