// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, RFC 3720) and TFRecord's masked form.
#ifndef LATCHKEY_WORKER_TENSORBOARD_CRC32C_H_
#define LATCHKEY_WORKER_TENSORBOARD_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace latchkey::tensorboard {

// The CRC-32C of n bytes (table-driven, one byte at a time).
uint32_t Crc32c(const void* data, size_t n);
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskCrc(uint32_t crc);
inline uint32_t MaskedCrc32c(const void* data, size_t n) { return MaskCrc(Crc32c(data, n)); }

}  // namespace latchkey::tensorboard

#endif  // LATCHKEY_WORKER_TENSORBOARD_CRC32C_H_
