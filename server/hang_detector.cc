#include "server/hang_detector.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace latchkey {
namespace {

// Order of the phases at the same (window, seq) along the plan.
int PhaseOrder(RankPhase p) {
  switch (p) {
    case RankPhase::kIdle:
    case RankPhase::kLatch:
    case RankPhase::kCompute:
      return 0;
    case RankPhase::kCollective:
      return 1;
    case RankPhase::kEval:
      return 2;
    case RankPhase::kCheckpoint:
      return 3;
  }
  return 0;
}

std::tuple<int64_t, int64_t, int, int> PlanKey(const RankWatch& r) {
  return {r.position.window, r.position.seq, PhaseOrder(r.position.phase), r.rank};
}

double TimeAt(const RankWatch& r) {
  return r.position.seconds + absl::ToDoubleSeconds(r.since_heartbeat);
}

std::string Seconds(double s) { return absl::StrFormat("%.0f s", s); }

}  // namespace

std::string DescribePosition(const RankPosition& p) {
  const std::string where = WhereName(p);
  if (p.window < 0) return absl::StrCat("before the first window (", where, ")");
  if (p.micro_batch < 0) return absl::StrCat("in window ", p.window, " (", where, ")");
  return absl::StrCat("in window ", p.window, ", micro-batch ", p.micro_batch, " (", where, ")");
}

std::optional<StallVerdict> FindStall(const std::vector<RankWatch>& ranks,
                                      absl::Duration hang_timeout, absl::Duration silent_after) {
  const double timeout = absl::ToDoubleSeconds(hang_timeout);
  for (const RankWatch& r : ranks) {
    const RankPosition& p = r.position;
    if (p.phase == RankPhase::kCollective && p.quiet_seconds >= 0 &&
        p.quiet_seconds + absl::ToDoubleSeconds(r.since_heartbeat) < timeout) {
      return std::nullopt;  // its bytes still move: slow, not stalled
    }
  }
  bool stalled = false;
  for (const RankWatch& r : ranks) {
    const bool silent = r.since_heartbeat > silent_after;
    if (TimeAt(r) > timeout && (r.position.phase != RankPhase::kIdle || silent)) stalled = true;
  }
  if (!stalled) return std::nullopt;

  const RankWatch* culprit = nullptr;
  for (const RankWatch& r : ranks) {  // a silent rank first: the one silent longest
    if (r.since_heartbeat <= silent_after) continue;
    if (culprit == nullptr || r.since_heartbeat > culprit->since_heartbeat ||
        (r.since_heartbeat == culprit->since_heartbeat && r.rank < culprit->rank)) {
      culprit = &r;
    }
  }
  const bool silent = culprit != nullptr;
  if (!silent) {
    for (const RankWatch& r : ranks) {
      if (culprit == nullptr || PlanKey(r) < PlanKey(*culprit)) culprit = &r;
    }
  }

  StallVerdict v;
  const RankPosition& p = culprit->position;
  v.stalled.rank = culprit->rank;
  v.stalled.window = p.window;
  v.stalled.micro_batch = p.micro_batch;
  v.stalled.where = WhereName(p);
  v.stalled.seconds = TimeAt(*culprit);
  v.message = absl::StrCat("rank ", culprit->rank, " stalled ", DescribePosition(p), " for ",
                           Seconds(v.stalled.seconds));
  if (silent) {
    absl::StrAppend(&v.message, ", no heartbeat for ",
                    Seconds(absl::ToDoubleSeconds(culprit->since_heartbeat)));
  }
  // The others, grouped by where they wait, in rank order of each group's first rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::map<std::string, size_t> index;
  std::vector<const RankWatch*> others;
  for (const RankWatch& r : ranks) {
    if (&r != culprit) others.push_back(&r);
  }
  std::sort(others.begin(), others.end(),
            [](const RankWatch* a, const RankWatch* b) { return a->rank < b->rank; });
  for (const RankWatch* r : others) {
    const std::string where = WhereName(r->position);
    auto [it, added] = index.emplace(where, groups.size());
    if (added) groups.push_back({where, {}});
    groups[it->second].second.push_back(r->rank);
  }
  std::vector<std::string> parts;
  for (const auto& [where, rs] : groups) {
    parts.push_back(absl::StrCat(rs.size() == 1 ? "rank " : "ranks ", absl::StrJoin(rs, ","),
                                 " waiting in ", where));
  }
  if (!parts.empty()) absl::StrAppend(&v.message, "; ", absl::StrJoin(parts, "; "));
  return v;
}

}  // namespace latchkey
