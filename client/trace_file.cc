#include "client/trace_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace latchkey {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

int StreamTid(const std::string& stream) {
  if (stream == "collectives") return 2;
  if (stream == "checkpoint") return 3;
  return 1;  // train
}

std::string EventName(const RankTrace::Span& s) {
  if (s.name == "window") return absl::StrCat("ProfilerStep#", s.step);
  if (s.name == "micro_batch") return absl::StrCat("micro_batch#", s.micro_batch);
  if (s.name == "collective") return absl::StrCat(s.op, " ", s.group, s.kv ? " K/V" : "");
  return s.name;
}

// PyTorch's categories where one fits: a step and a micro-batch are annotations, compute is an
// operator; collectives and the checkpoint's stages have their own.
const char* EventCategory(const RankTrace::Span& s) {
  if (s.name == "window" || s.name == "micro_batch") return "user_annotation";
  if (s.name == "collective") return "collective";
  if (s.name.rfind("checkpoint", 0) == 0) return "checkpoint";
  if (s.name == "latch_wait") return "latch";
  return "cpu_op";
}

}  // namespace

absl::StatusOr<RankTrace> ReadRankTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return ParseRankTrace(text, path);
}

absl::StatusOr<RankTrace> ParseRankTrace(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  RankTrace t;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a JSON object"));
    }
    try {
      if (j.contains("trace")) {  // a process's header
        t.rank = j.at("rank").get<int>();
        t.world_size = j.value("world_size", 0);
        t.backend = j.value("backend", "");
        t.workers.push_back(
            absl::StrCat(j.value("worker", ""), " attempt ", j.value("attempt", int64_t{0})));
        const int64_t err = j.value("clock_error_us", int64_t{-1});
        if (t.workers.size() == 1) {
          t.clock_error_us = err;
        } else if (t.clock_error_us >= 0) {
          t.clock_error_us = err < 0 ? -1 : std::max(t.clock_error_us, err);
        }
        t.dropped += j.value("dropped", int64_t{0});
        continue;
      }
      RankTrace::Span s;
      s.name = j.at("span").get<std::string>();
      s.stream = j.value("stream", "train");
      s.begin_us = j.at("begin_us").get<int64_t>();
      s.end_us = j.at("end_us").get<int64_t>();
      s.step = j.value("step", int64_t{-1});
      s.micro_batch = j.value("micro_batch", -1);
      s.op = j.value("op", "");
      s.group = j.value("group", "");
      s.bytes = j.value("bytes", int64_t{0});
      s.seq = j.value("seq", int64_t{0});
      s.kv = j.value("kv", false);
      t.spans.push_back(std::move(s));
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", e.what()));
    }
  }
  if (t.rank < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no header line"));
  return t;
}

absl::StatusOr<std::vector<RankTrace>> ReadRankTraces(const std::string& dir) {
  std::map<int, std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    // trace-R.jsonl
    absl::string_view name = e.path().filename().native();
    int rank = -1;
    if (absl::ConsumePrefix(&name, "trace-") && absl::ConsumeSuffix(&name, ".jsonl") &&
        absl::SimpleAtoi(name, &rank) && rank >= 0) {
      files[rank] = e.path().string();
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        ": no trace-R.jsonl (the ranks write theirs as their run ends: latchkey-worker "
        "--trace-jsonl, which `latchkey up` and `latchkey node` set)"));
  }
  std::vector<RankTrace> out;
  for (const auto& [rank, path] : files) {
    absl::StatusOr<RankTrace> t = ReadRankTrace(path);
    if (!t.ok()) return t.status();
    out.push_back(*std::move(t));
  }
  return out;
}

absl::StatusOr<StepRange> ParseStepRange(const std::string& text) {
  StepRange r;
  const auto dots = text.find("..");
  const std::string a = dots == std::string::npos ? text : text.substr(0, dots);
  const std::string b = dots == std::string::npos ? text : text.substr(dots + 2);
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: '", text, "' is not A..B, A.. or A (steps from 0, A <= B)"));
  };
  if (!absl::SimpleAtoi(a, &r.first) || r.first < 0) return bad();
  if (!b.empty() && (!absl::SimpleAtoi(b, &r.last) || r.last < r.first)) return bad();
  return r;
}

absl::StatusOr<TraceSummary> WriteChromeTrace(const std::vector<RankTrace>& ranks,
                                              const StepRange& steps, const std::string& job,
                                              std::ostream& out) {
  auto kept = [&](const RankTrace::Span& s) {
    return s.step >= steps.first && s.step <= steps.last;
  };
  TraceSummary sum;
  int64_t base = std::numeric_limits<int64_t>::max();
  for (const RankTrace& r : ranks) {
    for (const RankTrace::Span& s : r.spans) {
      if (kept(s)) base = std::min(base, s.begin_us);
    }
  }
  if (base == std::numeric_limits<int64_t>::max()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no span of steps ", steps.first, "..",
                     steps.last == std::numeric_limits<int64_t>::max() ? std::string()
                                                                       : std::to_string(steps.last),
                     " in the ranks' traces"));
  }
  json events = json::array();
  json rank_list = json::array();
  sum.clock_error_us = 0;
  for (const RankTrace& r : ranks) {
    rank_list.push_back(r.rank);
    sum.ranks++;
    sum.dropped += r.dropped;
    sum.clock_error_us = r.clock_error_us < 0 || sum.clock_error_us < 0
                             ? -1
                             : std::max(sum.clock_error_us, r.clock_error_us);
    std::string label;
    for (const std::string& w : r.workers) label += (label.empty() ? "" : "; ") + w;
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", r.rank},
                      {"args", {{"name", absl::StrCat("rank ", r.rank)}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "process_labels"}, {"pid", r.rank}, {"args", {{"labels", label}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", r.rank},
                      {"args", {{"sort_index", r.rank}}}});
    for (const char* stream : {"train", "collectives", "checkpoint"}) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", r.rank},
                        {"tid", StreamTid(stream)},
                        {"args", {{"name", stream}}}});
    }
    for (const RankTrace::Span& s : r.spans) {
      if (!kept(s)) continue;
      json args = {{"step", s.step}};
      if (s.micro_batch >= 0) args["micro_batch"] = s.micro_batch;
      if (s.name == "collective") {
        args["op"] = s.op;
        args["group"] = s.group;
        args["bytes"] = s.bytes;
        args["seq"] = s.seq;
        args["kv"] = s.kv ? 1 : 0;
      }
      events.push_back({{"ph", "X"},
                        {"cat", EventCategory(s)},
                        {"name", EventName(s)},
                        {"pid", r.rank},
                        {"tid", StreamTid(s.stream)},
                        {"ts", s.begin_us - base},
                        {"dur", std::max<int64_t>(0, s.end_us - s.begin_us)},
                        {"args", std::move(args)}});
      sum.events++;
      sum.first_step = sum.first_step < 0 ? s.step : std::min(sum.first_step, s.step);
      sum.last_step = std::max(sum.last_step, s.step);
    }
  }
  json doc;
  doc["schemaVersion"] = 1;
  doc["traceName"] = absl::StrCat("latchkey job ", job);
  doc["distributedInfo"] = {{"backend", ranks.front().backend},
                            {"rank", ranks.front().rank},
                            {"world_size", ranks.front().world_size},
                            {"ranks", rank_list}};
  doc["deviceProperties"] = json::array();
  doc["displayTimeUnit"] = "ms";
  doc["baseTimeNanoseconds"] = base * 1000;
  doc["clockErrorMicroseconds"] = sum.clock_error_us;
  doc["traceEvents"] = std::move(events);
  out << doc.dump() << '\n';
  if (!out) return absl::InternalError("writing the trace failed");
  return sum;
}

}  // namespace latchkey
