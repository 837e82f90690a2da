// libFuzzer target: ParseJobSpec on arbitrary bytes. When a spec parses, JobSpecToJson must
// give text that ParseJobSpec accepts back to an equal spec, `warnings` aside (job_spec.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<latchkey::JobSpec> spec = latchkey::ParseJobSpec(text, "/fuzz/base");
  if (!spec.ok()) {
    if (spec.status().message().empty()) {
      std::fprintf(stderr, "ParseJobSpec refused with an empty message\n");
      std::abort();
    }
    return 0;
  }
  const std::string json = latchkey::JobSpecToJson(*spec);
  absl::StatusOr<latchkey::JobSpec> again = latchkey::ParseJobSpec(json, "/elsewhere");
  if (!again.ok()) {
    std::fprintf(stderr, "JobSpecToJson output does not re-parse: %s\n%s\n",
                 again.status().ToString().c_str(), json.c_str());
    std::abort();
  }
  // `warnings` describe the submitted text and are not carried by JobSpecToJson (job_spec.h);
  // the canonical text may raise some again (a scheduler whose total_num_steps is below its
  // warmup), so neither side's are compared.
  spec->warnings.clear();
  again->warnings.clear();
  if (!(*again == *spec)) {
    std::fprintf(stderr, "JobSpecToJson round trip changed the spec:\n%s\nre-parsed as:\n%s\n",
                 json.c_str(), latchkey::JobSpecToJson(*again).c_str());
    std::abort();
  }
  return 0;
}
