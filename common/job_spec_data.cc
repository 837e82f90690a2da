#include "common/job_spec_data.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace latchkey {

using json = nlohmann::json;

absl::Status ResolveSpecPath(const std::string& field, const std::string& base_dir,
                             std::string* value) {
  if (value->empty()) return FieldError(field, "must not be empty");
  std::filesystem::path p(*value);
  if (p.is_relative()) p = std::filesystem::path(base_dir) / p;
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(p, ec);
  if (ec) return FieldError(field, absl::StrCat("cannot resolve '", *value, "': ", ec.message()));
  *value = abs.lexically_normal().string();
  return absl::OkStatus();
}

absl::StatusOr<std::array<double, 3>> ParseMegatronSplit(const std::string& field,
                                                         absl::string_view split) {
  std::vector<absl::string_view> parts = absl::StrSplit(split, absl::ByAnyChar(",/"));
  if (parts.empty() || parts.size() > 3) {
    return FieldError(field, absl::StrCat("'", split,
                                          "' must have 1 to 3 parts (train, "
                                          "validation, test), e.g. \"90,5,5\""));
  }
  std::array<double, 3> w = {0.0, 0.0, 0.0};
  double sum = 0.0;
  for (size_t i = 0; i < parts.size(); ++i) {
    double v = 0.0;
    if (!absl::SimpleAtod(parts[i], &v) || !std::isfinite(v) || v < 0.0) {
      return FieldError(field,
                        absl::StrCat("part ", i, " of '", split, "' is not a non-negative number"));
    }
    w[i] = v;
    sum += v;
  }
  if (!(sum > 0.0)) return FieldError(field, absl::StrCat("'", split, "' sums to 0"));
  for (double& v : w) v /= sum;  // Megatron's parse_and_normalize_split
  return w;
}

absl::Status ParseMegatronData(JsonObjectReader& s, const std::string& base_dir,
                               uint64_t default_seed, DataConfig* d) {
  d->format = DataFormat::kMegatron;
  for (const char* key : {"tokens_file", "synthetic", "dtype"}) {
    if (s.Get(key) != nullptr) {
      return s.Error(key, "not valid with format \"megatron\" (the .idx file names the dtype)");
    }
  }
  const json* blend = s.Get("blend");
  const bool has_prefix = s.Get("path_prefix") != nullptr;
  if (has_prefix == (blend != nullptr)) {
    absl::Status refused = s.Error("path_prefix",
                                   "exactly one of path_prefix or blend is required with format "
                                   "\"megatron\"");
    if (has_prefix) return refused;
    return s.WithMisspelling(std::move(refused), {"path_prefix", "blend"});
  }
  if (has_prefix) {
    LK_RETURN_IF_ERROR(s.String("path_prefix", &d->path_prefix));
    LK_RETURN_IF_ERROR(ResolveSpecPath(s.Path("path_prefix"), base_dir, &d->path_prefix));
  } else {
    if (!blend->is_array() || blend->empty()) {
      return s.Error("blend", "must be a non-empty array of {\"weight\", \"path_prefix\"}");
    }
    for (size_t i = 0; i < blend->size(); ++i) {
      const std::string key = absl::StrCat("blend[", i, "]");
      const json& e = (*blend)[i];
      if (!e.is_object()) {
        return s.Error(key, absl::StrCat("must be an object, got ", DescribeJson(e)));
      }
      JsonObjectReader r = s.Child(key, e);
      MegatronBlendEntry entry;
      LK_RETURN_IF_ERROR(r.Require("weight"));
      LK_RETURN_IF_ERROR(
          r.Double("weight", &entry.weight,
                   DoubleRange{0.0, true, std::numeric_limits<double>::infinity(), true}));
      LK_RETURN_IF_ERROR(r.Require("path_prefix"));
      LK_RETURN_IF_ERROR(r.String("path_prefix", &entry.path_prefix));
      LK_RETURN_IF_ERROR(ResolveSpecPath(r.Path("path_prefix"), base_dir, &entry.path_prefix));
      LK_RETURN_IF_ERROR(r.RefuseUnknown());
      d->blend.push_back(std::move(entry));
    }
  }
  LK_RETURN_IF_ERROR(s.String("split", &d->split));
  LK_RETURN_IF_ERROR(ParseMegatronSplit(s.Path("split"), d->split).status());
  d->megatron_seed = default_seed;
  LK_RETURN_IF_ERROR(s.Uint64("seed", &d->megatron_seed));
  if (d->megatron_seed > 0xffffffffULL) {
    // numpy's RandomState takes a 32-bit seed.
    return s.Error("seed", absl::StrCat(d->megatron_seed,
                                        " exceeds 2^32 - 1 (Megatron seeds "
                                        "numpy's RandomState with it)"));
  }
  if (s.Get("cache_dir") != nullptr) {
    LK_RETURN_IF_ERROR(s.String("cache_dir", &d->cache_dir));
    LK_RETURN_IF_ERROR(ResolveSpecPath(s.Path("cache_dir"), base_dir, &d->cache_dir));
  }
  LK_RETURN_IF_ERROR(s.Int64("num_samples", &d->num_samples, IntBounds{1}));
  return s.RefuseUnknown();
}

absl::Status ResolveMegatronData(JobSpec* spec) {
  const DataConfig& d = spec->data;
  if (!spec->eval.split.empty() && d.format != DataFormat::kMegatron) {
    return FieldError("latchkey.eval.split", "needs latchkey.data.format \"megatron\"");
  }
  if (d.format != DataFormat::kMegatron) return absl::OkStatus();
  if (spec->data.num_samples == 0) {
    // Fixed at submit: a later change of accumulation steps keeps the indices (and the order).
    const int64_t mbs = spec->FirstMicroBatch(spec->steps);
    const int64_t per_mb = static_cast<int64_t>(spec->dp()) * spec->micro_batch_size;
    if (per_mb > 0 && mbs > std::numeric_limits<int64_t>::max() / per_mb) {
      return FieldError("latchkey.data.num_samples", "steps * GAS * DP * MB overflows");
    }
    spec->data.num_samples = std::max<int64_t>(1, mbs * per_mb);
  }
  if (!spec->eval.split.empty()) {
    auto w = ParseMegatronSplit("latchkey.data.split", d.split);
    if (!w.ok()) return w.status();
    const int part = spec->eval.split == "validation" ? 1 : 2;
    if ((*w)[part] <= 0.0) {
      return FieldError("latchkey.eval.split",
                        absl::StrCat("\"", spec->eval.split, "\" is empty in latchkey.data.split '",
                                     d.split, "'"));
    }
  }
  return absl::OkStatus();
}

json MegatronDataToJson(const DataConfig& d) {
  json j = {{"format", "megatron"},
            {"split", d.split},
            {"seed", d.megatron_seed},
            {"num_samples", d.num_samples}};
  if (!d.blend.empty()) {
    json blend = json::array();
    for (const MegatronBlendEntry& e : d.blend) {
      blend.push_back({{"weight", e.weight}, {"path_prefix", e.path_prefix}});
    }
    j["blend"] = blend;
  } else {
    j["path_prefix"] = d.path_prefix;
  }
  if (!d.cache_dir.empty()) j["cache_dir"] = d.cache_dir;
  return j;
}

}  // namespace latchkey
