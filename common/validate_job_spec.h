// The cross-field rules of a job spec, checked after parsing (common/job_spec.cc reads each key
// and its own range; the rules here relate keys to one another): the model against the TP size,
// the sequence against the model, the layout against the world size, the windows' keys against
// each other, and latchkey.elastic against the layout. ParseJobSpec calls ValidateJobSpec last,
// so every parsed spec has passed it.
//
// Thread-safety: pure functions.
#ifndef LATCHKEY_COMMON_VALIDATE_JOB_SPEC_H_
#define LATCHKEY_COMMON_VALIDATE_JOB_SPEC_H_

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/model_config.h"

namespace latchkey {

// INVALID_ARGUMENT "<field.path>: <reason>" for the first rule the spec breaks, e.g.
// "latchkey.world_size: 6 is not divisible by tensor_parallel.autotp_size (4)".
absl::Status ValidateJobSpec(const JobSpec& spec);

// The rules of `model` alone against a TP size (used by the model builder too).
absl::Status ValidateModelForTp(const ModelConfig& model, int tp, bool has_partition_config);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_VALIDATE_JOB_SPEC_H_
