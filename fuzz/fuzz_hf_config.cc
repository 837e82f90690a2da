// libFuzzer target: ParseHfConfig (an HF config.json's text) on arbitrary bytes. When it
// parses, SerializeHfConfig must give text that ParseHfConfig accepts back to an equal config.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "worker/checkpoint/hf_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<latchkey::ModelConfig> config = latchkey::ParseHfConfig(text, "fuzz/config.json");
  if (!config.ok()) {
    if (config.status().message().empty()) {
      std::fprintf(stderr, "ParseHfConfig refused with an empty message\n");
      std::abort();
    }
    return 0;
  }
  const std::string json = latchkey::SerializeHfConfig(*config);
  absl::StatusOr<latchkey::ModelConfig> again = latchkey::ParseHfConfig(json, "again.json");
  if (!again.ok()) {
    std::fprintf(stderr, "SerializeHfConfig output does not re-parse: %s\n%s\n",
                 again.status().ToString().c_str(), json.c_str());
    std::abort();
  }
  if (!(*again == *config)) {
    std::fprintf(stderr, "SerializeHfConfig round trip changed the config:\n%s\n", json.c_str());
    std::abort();
  }
  return 0;
}
