#include "server/partition.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace latchkey {
namespace {

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

std::string Seconds(double s) { return absl::StrFormat("%.0f s", s); }

}  // namespace

std::string PartitionVerdict::Links() const {
  std::vector<std::string> parts;
  for (const CutLink& l : links) {
    parts.push_back(absl::StrCat("the link between ", l.host_a, " and ", l.host_b,
                                 " (unreachable for ", Seconds(l.seconds), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

double PartitionVerdict::Longest() const {
  double out = 0;
  for (const CutLink& l : links) out = std::max(out, l.seconds);
  return out;
}

std::optional<PartitionVerdict> FindPartition(const std::vector<RankReach>& ranks) {
  std::map<int, const RankReach*> by_rank;
  for (const RankReach& r : ranks) by_rank[r.rank] = &r;
  struct Side {
    std::set<int> a, b;
    double seconds = 0.0;
    std::string where;  // of the first reporter on side a
  };
  std::map<std::pair<std::string, std::string>, Side> links;
  int pairs = 0;
  for (const RankReach& r : ranks) {
    if (r.reach == nullptr) continue;
    for (int peer : r.reach->unreachable) {
      auto it = by_rank.find(peer);
      if (it == by_rank.end() || it->second->host == r.host) continue;
      ++pairs;
      const bool first = r.host < it->second->host;
      const auto key = first ? std::make_pair(r.host, it->second->host)
                             : std::make_pair(it->second->host, r.host);
      Side& side = links[key];
      (first ? side.a : side.b).insert(r.rank);
      (first ? side.b : side.a).insert(peer);
      side.seconds = std::max(side.seconds, r.reach->unreachable_seconds);
      if (side.where.empty()) side.where = r.where;
    }
  }
  if (links.empty()) return std::nullopt;
  PartitionVerdict v;
  v.pairs = pairs;
  std::vector<std::string> parts;
  for (const auto& [hosts, side] : links) {
    CutLink l;
    l.host_a = hosts.first;
    l.host_b = hosts.second;
    l.ranks_a.assign(side.a.begin(), side.a.end());
    l.ranks_b.assign(side.b.begin(), side.b.end());
    l.seconds = side.seconds;
    parts.push_back(absl::StrCat(Ranks(l.ranks_a), " (", l.host_a, ") cannot reach ",
                                 Ranks(l.ranks_b), " (", l.host_b, ") for ", Seconds(l.seconds),
                                 side.where.empty() ? "" : absl::StrCat(" (", side.where, ")")));
    v.links.push_back(std::move(l));
  }
  v.message = absl::StrJoin(parts, "; ");
  return v;
}

}  // namespace latchkey
