#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;

// abseil 20220623 has no RETURN_IF_ERROR; keep a private one.
#define LK_RETURN_IF_ERROR(expr)             \
  do {                                       \
    const absl::Status lk_status_ = (expr);  \
    if (!lk_status_.ok()) return lk_status_; \
  } while (0)

absl::Status Err(const std::string& path, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", reason));
}

// "string \"4\"" etc., short enough for a one-line error.
std::string Describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return absl::StrCat(v.type_name(), " ", text);
}

// One JSON object of the spec, read key by key; remembers which keys were read so the rest can be
// refused (model, latchkey) or listed as warnings (DeepSpeed sections).
class Section {
 public:
  Section(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  std::string Path(absl::string_view key) const {
    return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  }
  // nullptr when absent. Marks the key as read.
  const json* Get(const char* key) {
    used_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  absl::Status Require(const char* key) {
    if (Get(key) == nullptr) return Err(Path(key), "required");
    return absl::OkStatus();
  }

  // Each reader leaves *out unchanged when the key is absent.
  absl::Status Int64(const char* key, int64_t* out, int64_t min) {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer()) return Err(Path(key), "must be an integer, got " + Describe(*v));
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Err(Path(key), "out of range");
    }
    const int64_t x = v->get<int64_t>();
    if (x < min) return Err(Path(key), absl::StrCat("must be >= ", min, ", got ", x));
    *out = x;
    return absl::OkStatus();
  }
  absl::Status Int(const char* key, int* out, int64_t min) {
    int64_t x = *out;
    LK_RETURN_IF_ERROR(Int64(key, &x, min));
    if (x > std::numeric_limits<int>::max()) return Err(Path(key), "out of range");
    *out = static_cast<int>(x);
    return absl::OkStatus();
  }
  absl::Status Uint64(const char* key, uint64_t* out) {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_unsigned()) {
      return Err(Path(key), "must be a non-negative integer, got " + Describe(*v));
    }
    *out = v->get<uint64_t>();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Err(Path(key), "must be a number, got " + Describe(*v));
    *out = v->get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Err(Path(key), "must be true or false, got " + Describe(*v));
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out) {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Err(Path(key), "must be a string, got " + Describe(*v));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  // *out = the object, or nullptr when absent.
  absl::Status Object(const char* key, const json** out) {
    const json* v = Get(key);
    *out = v;
    if (v != nullptr && !v->is_object()) {
      return Err(Path(key), "must be an object, got " + Describe(*v));
    }
    return absl::OkStatus();
  }

  std::vector<std::string> UnknownKeys() const {
    std::vector<std::string> keys;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (used_.count(it.key()) == 0) keys.push_back(it.key());
    }
    return keys;
  }
  absl::Status RefuseUnknown() const {
    std::vector<std::string> keys = UnknownKeys();
    if (!keys.empty()) return Err(Path(keys.front()), "unknown key");
    return absl::OkStatus();
  }
  void WarnUnknown(std::vector<std::string>* warnings) const {
    for (const std::string& k : UnknownKeys()) {
      warnings->push_back(path_.empty() ? absl::StrCat("unknown top-level key '", k, "' ignored")
                                        : absl::StrCat("unknown key '", Path(k), "' ignored"));
    }
  }

 private:
  const json& obj_;
  std::string path_;
  std::set<std::string> used_;
};

absl::Status CheckRange(const std::string& path, double x, double lo, bool lo_open, double hi,
                        bool hi_open) {
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (ok) return absl::OkStatus();
  std::string range = absl::StrCat(lo_open ? "(" : "[", lo, ", ");
  if (std::isinf(hi)) {
    absl::StrAppend(&range, "inf)");
  } else {
    absl::StrAppend(&range, hi, hi_open ? ")" : "]");
  }
  return Err(path, absl::StrCat("must be in ", range, ", got ", x));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status ResolvePath(const std::string& field, const std::string& base_dir,
                         std::string* value) {
  if (value->empty()) return Err(field, "must not be empty");
  std::filesystem::path p(*value);
  if (p.is_relative()) p = std::filesystem::path(base_dir) / p;
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(p, ec);
  if (ec) return Err(field, absl::StrCat("cannot resolve '", *value, "': ", ec.message()));
  *value = abs.lexically_normal().string();
  return absl::OkStatus();
}

absl::Status ParseModel(const json& obj, ModelConfig* m) {
  Section s(obj, "model");
  std::string type;
  LK_RETURN_IF_ERROR(s.Require("model_type"));
  LK_RETURN_IF_ERROR(s.String("model_type", &type));
  if (type != "gpt_bigcode") {
    return Err("model.model_type", absl::StrCat("must be \"gpt_bigcode\", got \"", type, "\""));
  }
  for (const char* key : {"n_layer", "n_embd", "n_head", "vocab_size", "n_positions"}) {
    LK_RETURN_IF_ERROR(s.Require(key));
  }
  LK_RETURN_IF_ERROR(s.Int("n_layer", &m->n_layer, 1));
  LK_RETURN_IF_ERROR(s.Int("n_embd", &m->n_embd, 1));
  LK_RETURN_IF_ERROR(s.Int("n_head", &m->n_head, 1));
  const json* inner = s.Get("n_inner");
  if (inner != nullptr && !inner->is_null()) {
    LK_RETURN_IF_ERROR(s.Int("n_inner", &m->n_inner, 1));
  } else {
    m->n_inner = 0;
  }
  LK_RETURN_IF_ERROR(s.Int("vocab_size", &m->vocab_size, 1));
  LK_RETURN_IF_ERROR(s.Int("n_positions", &m->n_positions, 1));
  LK_RETURN_IF_ERROR(s.Bool("multi_query", &m->multi_query));
  LK_RETURN_IF_ERROR(s.Bool("scale_attn_weights", &m->scale_attn_weights));
  for (auto [key, field] : {std::pair<const char*, double*>{"resid_pdrop", &m->resid_pdrop},
                            {"embd_pdrop", &m->embd_pdrop},
                            {"attn_pdrop", &m->attn_pdrop}}) {
    LK_RETURN_IF_ERROR(s.Double(key, field));
    LK_RETURN_IF_ERROR(CheckRange(s.Path(key), *field, 0.0, false, 1.0, true));
  }
  LK_RETURN_IF_ERROR(s.Double("layer_norm_epsilon", &m->layer_norm_epsilon));
  LK_RETURN_IF_ERROR(
      CheckRange("model.layer_norm_epsilon", m->layer_norm_epsilon, 0.0, true, kInf, true));
  LK_RETURN_IF_ERROR(s.Double("initializer_range", &m->initializer_range));
  LK_RETURN_IF_ERROR(
      CheckRange("model.initializer_range", m->initializer_range, 0.0, false, kInf, true));
  return s.RefuseUnknown();
}

absl::Status ParseOptimizer(const json& obj, OptimizerConfig* o, std::vector<std::string>* warn) {
  Section s(obj, "optimizer");
  std::string type;
  LK_RETURN_IF_ERROR(s.Require("type"));
  LK_RETURN_IF_ERROR(s.String("type", &type));
  const std::string lower = absl::AsciiStrToLower(type);
  if (lower == "adamw") {
    o->type = OptimizerType::kAdamW;
  } else if (lower == "sgd") {
    o->type = OptimizerType::kSgd;
    o->weight_decay = 0.0;  // torch.optim.SGD's default
  } else {
    return Err("optimizer.type", absl::StrCat("'", type, "' is not supported (SGD or AdamW)"));
  }
  const json* params = nullptr;
  LK_RETURN_IF_ERROR(s.Object("params", &params));
  s.WarnUnknown(warn);
  if (params == nullptr) return absl::OkStatus();

  Section p(*params, "optimizer.params");
  LK_RETURN_IF_ERROR(p.Double("lr", &o->lr));
  LK_RETURN_IF_ERROR(CheckRange("optimizer.params.lr", o->lr, 0.0, true, kInf, true));
  if (o->type == OptimizerType::kSgd) {
    LK_RETURN_IF_ERROR(p.Double("momentum", &o->momentum));
    if (o->momentum != 0.0) {
      return Err("optimizer.params.momentum",
                 absl::StrCat("SGD momentum ", o->momentum, " is not supported yet (only 0)"));
    }
    LK_RETURN_IF_ERROR(p.Double("weight_decay", &o->weight_decay));
    if (o->weight_decay != 0.0) {
      return Err("optimizer.params.weight_decay", "SGD weight decay is not supported yet (only 0)");
    }
  } else {
    const json* betas = p.Get("betas");
    if (betas != nullptr) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
          !(*betas)[1].is_number()) {
        return Err("optimizer.params.betas",
                   "must be an array of two numbers, got " + Describe(*betas));
      }
      for (int i = 0; i < 2; ++i) {
        o->betas[i] = (*betas)[i].get<double>();
        LK_RETURN_IF_ERROR(CheckRange(absl::StrCat("optimizer.params.betas[", i, "]"), o->betas[i],
                                      0.0, false, 1.0, true));
      }
    }
    LK_RETURN_IF_ERROR(p.Double("eps", &o->eps));
    LK_RETURN_IF_ERROR(CheckRange("optimizer.params.eps", o->eps, 0.0, true, kInf, true));
    LK_RETURN_IF_ERROR(p.Double("weight_decay", &o->weight_decay));
    LK_RETURN_IF_ERROR(
        CheckRange("optimizer.params.weight_decay", o->weight_decay, 0.0, false, kInf, true));
  }
  std::vector<std::string> unknown = p.UnknownKeys();
  if (!unknown.empty()) {
    return Err(p.Path(unknown.front()),
               absl::StrCat("unknown or unsupported parameter for ",
                            o->type == OptimizerType::kSgd ? "SGD" : "AdamW"));
  }
  return absl::OkStatus();
}

absl::Status ParseData(const json& obj, const std::string& base_dir, DataConfig* d) {
  Section s(obj, "latchkey.data");
  const json* synthetic = nullptr;
  LK_RETURN_IF_ERROR(s.Object("synthetic", &synthetic));
  const bool has_file = s.Get("tokens_file") != nullptr;
  if (has_file == (synthetic != nullptr)) {
    return Err("latchkey.data", "exactly one of tokens_file or synthetic is required");
  }
  if (has_file) {
    LK_RETURN_IF_ERROR(s.String("tokens_file", &d->tokens_file));
    LK_RETURN_IF_ERROR(ResolvePath("latchkey.data.tokens_file", base_dir, &d->tokens_file));
  } else {
    Section syn(*synthetic, "latchkey.data.synthetic");
    uint64_t seed = 1;
    LK_RETURN_IF_ERROR(syn.Uint64("seed", &seed));
    LK_RETURN_IF_ERROR(syn.RefuseUnknown());
    d->synthetic_seed = seed;
  }
  std::string dtype = "uint16";
  LK_RETURN_IF_ERROR(s.String("dtype", &dtype));
  if (dtype == "uint16") {
    d->dtype = TokenDtype::kUint16;
  } else if (dtype == "uint32") {
    d->dtype = TokenDtype::kUint32;
  } else {
    return Err("latchkey.data.dtype", absl::StrCat("unknown dtype '", dtype, "' (uint16, uint32)"));
  }
  return s.RefuseUnknown();
}

absl::Status ParseLatchkey(const json& obj, const std::string& base_dir, JobSpec* spec,
                           bool* has_world_size, bool* has_schedule) {
  Section s(obj, "latchkey");
  LK_RETURN_IF_ERROR(s.Require("seq_len"));
  LK_RETURN_IF_ERROR(s.Int("seq_len", &spec->seq_len, 1));
  LK_RETURN_IF_ERROR(s.Require("steps"));
  LK_RETURN_IF_ERROR(s.Int64("steps", &spec->steps, 1));
  LK_RETURN_IF_ERROR(s.Uint64("seed", &spec->seed));
  *has_world_size = s.Get("world_size") != nullptr;
  LK_RETURN_IF_ERROR(s.Int("world_size", &spec->world_size, 1));
  std::string kv;
  if (s.Get("kv_reduce") != nullptr) {
    LK_RETURN_IF_ERROR(s.String("kv_reduce", &kv));
    std::optional<KvReducePolicy> p = ParseKvReducePolicy(kv);
    if (!p) {
      return Err(
          "latchkey.kv_reduce",
          absl::StrCat("unknown policy '", kv, "' (auto, per_micro_batch, deferred, coalesced)"));
    }
    spec->kv_reduce = *p;
  }
  const json* sched = s.Get("window_schedule");
  *has_schedule = sched != nullptr;
  if (sched != nullptr) {
    if (!sched->is_array()) {
      return Err("latchkey.window_schedule",
                 "must be an array of integers, got " + Describe(*sched));
    }
    for (size_t i = 0; i < sched->size(); ++i) {
      const json& e = (*sched)[i];
      const std::string path = absl::StrCat("latchkey.window_schedule[", i, "]");
      if (!e.is_number_integer()) return Err(path, "must be an integer, got " + Describe(e));
      const bool too_big =
          e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{std::numeric_limits<int>::max()};
      if (too_big || e.get<int64_t>() < 1) {
        return Err(path, absl::StrCat("must be in [1, ", std::numeric_limits<int>::max(), "], got ",
                                      e.dump()));
      }
      spec->window_schedule.push_back(e.get<int>());
    }
  }
  if (const json* mask = s.Get("no_sync"); mask != nullptr) {
    if (!mask->is_array() || mask->empty()) {
      return Err("latchkey.no_sync", "must be a non-empty array of booleans, got " + Describe(*mask));
    }
    for (size_t i = 0; i < mask->size(); ++i) {
      if (!(*mask)[i].is_boolean()) {
        return Err(absl::StrCat("latchkey.no_sync[", i, "]"),
                   "must be a boolean, got " + Describe((*mask)[i]));
      }
      spec->no_sync.push_back((*mask)[i].get<bool>());
    }
  }
  LK_RETURN_IF_ERROR(s.String("init_from", &spec->init_from));
  if (s.Get("init_from") != nullptr) {
    LK_RETURN_IF_ERROR(ResolvePath("latchkey.init_from", base_dir, &spec->init_from));
  }
  const json* data = nullptr;
  LK_RETURN_IF_ERROR(s.Require("data"));
  LK_RETURN_IF_ERROR(s.Object("data", &data));
  LK_RETURN_IF_ERROR(ParseData(*data, base_dir, &spec->data));
  return s.RefuseUnknown();
}

// The DeepSpeed keys (top level) and the cross-field checks.
absl::Status ParseTop(const json& root, const std::string& base_dir, JobSpec* spec) {
  Section top(root, "");
  const json* obj = nullptr;

  LK_RETURN_IF_ERROR(top.Require("model"));
  LK_RETURN_IF_ERROR(top.Object("model", &obj));
  LK_RETURN_IF_ERROR(ParseModel(*obj, &spec->model));

  LK_RETURN_IF_ERROR(top.Int("train_micro_batch_size_per_gpu", &spec->micro_batch_size, 1));
  LK_RETURN_IF_ERROR(top.Int("gradient_accumulation_steps", &spec->gradient_accumulation_steps, 1));
  LK_RETURN_IF_ERROR(top.Double("gradient_clipping", &spec->gradient_clipping));
  LK_RETURN_IF_ERROR(
      CheckRange("gradient_clipping", spec->gradient_clipping, 0.0, false, kInf, true));
  LK_RETURN_IF_ERROR(
      top.Bool("managed_gradient_accumulation", &spec->managed_gradient_accumulation));

  LK_RETURN_IF_ERROR(top.Object("zero_optimization", &obj));
  if (obj != nullptr) {
    Section z(*obj, "zero_optimization");
    LK_RETURN_IF_ERROR(z.Int("stage", &spec->zero_stage, 0));
    if (spec->zero_stage == 2 || spec->zero_stage == 3) {
      return Err("zero_optimization.stage",
                 absl::StrCat("ZeRO ", spec->zero_stage, " is not supported yet (use 0 or 1)"));
    }
    if (spec->zero_stage > 3) {
      return Err("zero_optimization.stage", absl::StrCat("unknown stage ", spec->zero_stage));
    }
    z.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("bf16", &obj));
  if (obj != nullptr) {
    Section b(*obj, "bf16");
    LK_RETURN_IF_ERROR(b.Bool("enabled", &spec->bf16));
    b.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("fp16", &obj));
  if (obj != nullptr) {
    Section f(*obj, "fp16");
    bool fp16 = false;
    LK_RETURN_IF_ERROR(f.Bool("enabled", &fp16));
    if (fp16) return Err("fp16.enabled", "fp16 is not supported (use bf16)");
    f.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("optimizer", &obj));
  if (obj != nullptr) LK_RETURN_IF_ERROR(ParseOptimizer(*obj, &spec->optimizer, &spec->warnings));
  LK_RETURN_IF_ERROR(top.Object("tensor_parallel", &obj));
  if (obj != nullptr) {
    Section t(*obj, "tensor_parallel");
    LK_RETURN_IF_ERROR(t.Int("autotp_size", &spec->tp, 1));
    const json* pc = t.Get("partition_config");
    spec->has_partition_config = pc != nullptr && !pc->is_null();
    t.WarnUnknown(&spec->warnings);
  }

  bool has_world_size = false;
  bool has_schedule = false;
  LK_RETURN_IF_ERROR(top.Require("latchkey"));
  LK_RETURN_IF_ERROR(top.Object("latchkey", &obj));
  LK_RETURN_IF_ERROR(ParseLatchkey(*obj, base_dir, spec, &has_world_size, &has_schedule));
  top.WarnUnknown(&spec->warnings);

  // Cross-field rules.
  LK_RETURN_IF_ERROR(ValidateModelForTp(spec->model, spec->tp, spec->has_partition_config));
  if (spec->seq_len > spec->model.n_positions) {
    return Err("latchkey.seq_len", absl::StrCat(spec->seq_len, " exceeds model.n_positions (",
                                                spec->model.n_positions, ")"));
  }
  if (!has_world_size) spec->world_size = spec->tp;
  if (spec->world_size % spec->tp != 0) {
    return Err("latchkey.world_size",
               absl::StrCat(spec->world_size, " is not divisible by tensor_parallel.autotp_size (",
                            spec->tp, ")"));
  }
  if (spec->managed_gradient_accumulation && has_schedule) {
    return Err("latchkey.window_schedule",
               "only valid with managed_gradient_accumulation: false (managed windows use "
               "gradient_accumulation_steps)");
  }
  if (!spec->no_sync.empty()) {
    if (!spec->managed_gradient_accumulation) {
      return Err("latchkey.no_sync", "only valid with managed windows (one mask for every window)");
    }
    if (static_cast<int>(spec->no_sync.size()) != spec->gradient_accumulation_steps) {
      return Err("latchkey.no_sync",
                 absl::StrCat("has ", spec->no_sync.size(),
                              " entries; gradient_accumulation_steps is ",
                              spec->gradient_accumulation_steps));
    }
    if (spec->no_sync.back()) {
      return Err(absl::StrCat("latchkey.no_sync[", spec->no_sync.size() - 1, "]"),
                 "the boundary micro-batch always synchronizes and cannot be no_sync");
    }
  }
  if (!spec->managed_gradient_accumulation && spec->window_schedule.empty()) {
    return Err("latchkey.window_schedule",
               "a non-empty schedule is required when managed_gradient_accumulation is false");
  }
  return absl::OkStatus();
}

}  // namespace

int JobSpec::WindowLength(int64_t s) const {
  if (managed_gradient_accumulation || window_schedule.empty()) {
    return gradient_accumulation_steps;
  }
  const int64_t last = static_cast<int64_t>(window_schedule.size()) - 1;
  return window_schedule[static_cast<size_t>(std::min(std::max<int64_t>(s, 0), last))];
}

int64_t JobSpec::FirstMicroBatch(int64_t s) const {
  if (s <= 0) return 0;
  if (managed_gradient_accumulation || window_schedule.empty()) {
    return s * gradient_accumulation_steps;
  }
  const int64_t listed = static_cast<int64_t>(window_schedule.size());
  int64_t m = 0;
  for (int64_t i = 0; i < std::min(s, listed); ++i) m += window_schedule[i];
  if (s > listed) m += (s - listed) * window_schedule.back();  // the last length repeats
  return m;
}

absl::Status ValidateModelForTp(const ModelConfig& model, int tp, bool has_partition_config) {
  if (tp < 1) return Err("tensor_parallel.autotp_size", absl::StrCat("must be >= 1, got ", tp));
  if (model.n_head < 1)
    return Err("model.n_head", absl::StrCat("must be >= 1, got ", model.n_head));
  if (model.n_embd < 1)
    return Err("model.n_embd", absl::StrCat("must be >= 1, got ", model.n_embd));
  if (model.n_embd % model.n_head != 0) {
    return Err("model.n_embd", absl::StrCat(model.n_embd, " is not divisible by model.n_head (",
                                            model.n_head, ")"));
  }
  if (tp > model.n_head) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " exceeds model.n_head (", model.n_head, ")"));
  }
  if (model.n_head % tp != 0) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " does not divide model.n_head (", model.n_head, ")"));
  }
  if (model.inner() % tp != 0) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " does not divide model.n_inner (", model.inner(), ")"));
  }
  if (has_partition_config && model.multi_query) {
    return Err("tensor_parallel.partition_config",
               "not supported for a multi_query model (its single K/V head is replicated; "
               "latchkey shards MQA itself)");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, const std::string& base_dir) {
  JobSpec spec;
  try {
    json root = json::parse(json_text.begin(), json_text.end());
    if (!root.is_object()) return Err("spec", "must be a JSON object, got " + Describe(root));
    LK_RETURN_IF_ERROR(ParseTop(root, base_dir, &spec));
  } catch (const json::parse_error& e) {
    return Err("spec", absl::StrCat("not valid JSON: ", e.what()));
  } catch (const json::exception& e) {
    // The readers check types before every get<>(); this is a backstop, never a crash.
    return Err("spec", e.what());
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the job spec"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  return ParseJobSpec(text.str(), abs.parent_path().string());
}

}  // namespace latchkey
