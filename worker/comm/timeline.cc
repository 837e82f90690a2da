#include "worker/comm/timeline.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace latchkey::comm {

namespace {

struct KindEntry {
  SpanKind kind;
  const char* name;
  SpanStream stream;
};
constexpr KindEntry kKinds[] = {
    {SpanKind::kWindow, "window", SpanStream::kTrain},
    {SpanKind::kLatchWait, "latch_wait", SpanStream::kTrain},
    {SpanKind::kMicroBatch, "micro_batch", SpanStream::kTrain},
    {SpanKind::kData, "data", SpanStream::kTrain},
    {SpanKind::kForward, "forward", SpanStream::kTrain},
    {SpanKind::kBackward, "backward", SpanStream::kTrain},
    {SpanKind::kBoundary, "boundary", SpanStream::kTrain},
    {SpanKind::kOptimizer, "optimizer", SpanStream::kTrain},
    {SpanKind::kEval, "eval", SpanStream::kTrain},
    {SpanKind::kCheckpoint, "checkpoint", SpanStream::kTrain},
    {SpanKind::kCheckpointWrite, "checkpoint_write", SpanStream::kCheckpoint},
    {SpanKind::kCheckpointCommit, "checkpoint_commit", SpanStream::kTrain},
    {SpanKind::kCollective, "collective", SpanStream::kCollectives},
};

const KindEntry& EntryOf(SpanKind kind) {
  for (const KindEntry& e : kKinds) {
    if (e.kind == kind) return e;
  }
  return kKinds[0];
}

// A sample older than this gives way to a newer one whatever their errors (steady clocks of two
// hosts drift apart by some microseconds a second).
constexpr int64_t kSampleLifetimeMicros = 60'000'000;

}  // namespace

const char* SpanKindName(SpanKind kind) { return EntryOf(kind).name; }
SpanStream StreamOf(SpanKind kind) { return EntryOf(kind).stream; }

const char* SpanStreamName(SpanStream stream) {
  switch (stream) {
    case SpanStream::kTrain:
      return "train";
    case SpanStream::kCollectives:
      return "collectives";
    case SpanStream::kCheckpoint:
      return "checkpoint";
  }
  return "train";
}

Timeline::Timeline(size_t capacity) : capacity_(capacity) {
  ring_.resize(capacity);
  // Until the coordinator's clock is measured: this host's (its Unix time against the steady
  // clock, error unknown).
  offset_micros_ = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count() -
                   NowMicros();
}

void Timeline::Add(const Span& span) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = span;
  next_ = (next_ + 1) % capacity_;
  if (count_ < capacity_) {
    ++count_;
  } else {
    ++dropped_;
  }
}

int16_t Timeline::GroupIndex(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i] == name) return static_cast<int16_t>(i);
  }
  groups_.push_back(name);
  return static_cast<int16_t>(groups_.size() - 1);
}

void Timeline::NoteClock(int64_t offset_micros, int64_t error_micros) {
  const int64_t now = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (error_micros_ < 0 || error_micros <= error_micros_ ||
      now - sampled_at_ > kSampleLifetimeMicros) {
    offset_micros_ = offset_micros;
    error_micros_ = error_micros;
    sampled_at_ = now;
  }
}

Timeline::Contents Timeline::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  Contents c;
  c.spans.reserve(count_);
  for (size_t i = 0; i < count_; ++i) {
    c.spans.push_back(ring_[(next_ + capacity_ - count_ + i) % capacity_]);
  }
  c.groups = groups_;
  c.offset_micros = offset_micros_;
  c.error_micros = error_micros_;
  c.dropped = dropped_;
  return c;
}

void Timeline::SetIdentity(const nlohmann::ordered_json& identity) {
  std::string text = identity.dump();
  std::lock_guard<std::mutex> lock(mu_);
  identity_ = std::move(text);
}

void Timeline::WriteJsonl(std::ostream& out) const { out << Jsonl(); }

std::string Timeline::Jsonl(int64_t first_step, int64_t last_step, size_t max_bytes) const {
  const Contents c = Read();
  nlohmann::ordered_json header;
  {
    std::lock_guard<std::mutex> lock(mu_);
    header = nlohmann::ordered_json::parse(identity_);
  }
  // Newest first, until the budget is spent (a header takes some 300 bytes).
  std::vector<std::string> lines;
  size_t bytes = 512;
  int64_t left_out = 0;
  for (auto it = c.spans.rbegin(); it != c.spans.rend(); ++it) {
    const Span& s = *it;
    if (s.step < first_step || (last_step >= 0 && s.step > last_step)) continue;
    if (bytes >= max_bytes) {
      ++left_out;
      continue;
    }
    nlohmann::ordered_json j;
    j["span"] = SpanKindName(s.kind);
    j["stream"] = SpanStreamName(StreamOf(s.kind));
    j["begin_us"] = s.begin_us + c.offset_micros;
    j["end_us"] = s.end_us + c.offset_micros;
    j["step"] = s.step;
    if (s.micro_batch >= 0) j["micro_batch"] = s.micro_batch;
    if (s.kind == SpanKind::kCollective) {
      j["op"] = s.op != nullptr ? s.op : "";
      j["group"] = s.group >= 0 && static_cast<size_t>(s.group) < c.groups.size()
                       ? c.groups[static_cast<size_t>(s.group)]
                       : "";
      j["bytes"] = s.bytes;
      j["seq"] = s.seq;
      j["kv"] = s.kv;
    }
    std::string line = j.dump();
    line += '\n';
    if (bytes + line.size() > max_bytes) {
      bytes = max_bytes;  // no room for this one: every older one is left out too
      ++left_out;
      continue;
    }
    bytes += line.size();
    lines.push_back(std::move(line));
  }
  header["clock"] = c.error_micros >= 0 ? "coordinator" : "local";
  header["clock_error_us"] = c.error_micros;
  header["spans"] = lines.size();
  header["dropped"] = c.dropped + left_out;
  std::string out = header.dump();
  out += '\n';
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) out += *it;
  return out;
}

}  // namespace latchkey::comm
