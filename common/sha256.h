// SHA-256 in lower-case hex (OpenSSL): checkpoint file checksums, token hashes, NCCL id digests.
#ifndef LATCHKEY_COMMON_SHA256_H_
#define LATCHKEY_COMMON_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace latchkey {

std::string Sha256Hex(absl::string_view data);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_SHA256_H_
