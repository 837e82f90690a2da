#include "server/stragglers.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

namespace latchkey {
namespace {

// The slowest replica's time under `split` (micro-batches times pace).
double WindowTime(const std::vector<int>& split, const std::vector<double>& pace) {
  double t = 0.0;
  for (size_t d = 0; d < split.size(); ++d) t = std::max(t, split[d] * pace[d]);
  return t;
}

void Push(std::deque<double>& samples, double value, int keep) {
  samples.push_back(value);
  while (samples.size() > static_cast<size_t>(std::max(1, keep))) samples.pop_front();
}

}  // namespace

void StragglerTracker::NewAttempt(const RankGrid& grid) {
  partial_.clear();
  if (grid.world_size == grid_.world_size && grid.tp == grid_.tp) return;
  grid_ = grid;
  ranks_.assign(static_cast<size_t>(grid.world_size), Rank{});
  replicas_.assign(static_cast<size_t>(grid.dp()), Streak{});
  slowdown_.assign(static_cast<size_t>(grid.world_size), 0.0);
  named_.clear();
  scored_ = false;
  split_.clear();
  split_n_ = 0;
}

std::optional<std::vector<StragglerTracker::Change>> StragglerTracker::Note(
    int64_t step, int rank, int micro_batches, double compute_seconds, double micro_batch_seconds) {
  if (!grid_.contains(rank)) return std::nullopt;
  if (micro_batches > 0 && compute_seconds > 0 && micro_batch_seconds > 0) {
    Rank& r = ranks_[static_cast<size_t>(rank)];
    Push(r.compute, compute_seconds / micro_batches, config_.sample_steps);
    Push(r.pace, micro_batch_seconds / micro_batches, config_.sample_steps);
  }
  if (++partial_[step] < grid_.world_size) return std::nullopt;
  partial_.erase(step);
  return Judge(step);
}

double StragglerTracker::Median(const std::deque<double>& samples) {
  if (samples.empty()) return 0.0;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

double StragglerTracker::Pace(int dp_rank) const {
  double pace = 0.0;
  for (int t = 0; t < grid_.tp; ++t) {
    const double p = Median(ranks_[static_cast<size_t>(grid_.rank(dp_rank, t))].pace);
    if (p <= 0) return 0.0;  // a replica is measured once all its ranks are
    pace = std::max(pace, p);
  }
  return pace;
}

std::vector<double> StragglerTracker::OverOthers(const std::vector<double>& scores) {
  // The scored entries by score: the median of all but the one at sorted index i is read off
  // this one list (the others' elements k of M = size - 1 are sorted[k < i ? k : k + 1]).
  std::vector<std::pair<double, size_t>> sorted;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (scores[i] > 0) sorted.emplace_back(scores[i], i);
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> out(scores.size(), 0.0);
  const size_t m = sorted.empty() ? 0 : sorted.size() - 1;
  for (size_t i = 0; i < sorted.size() && m > 0; ++i) {
    auto other = [&](size_t k) { return sorted[k < i ? k : k + 1].first; };
    out[sorted[i].second] = sorted[i].first / ((other((m - 1) / 2) + other(m / 2)) / 2);
  }
  return out;
}

bool StragglerTracker::Streak::Judge(double s, const StragglerConfig& config, int64_t step,
                                     bool* cleared) {
  *cleared = false;
  if (s <= 0) return false;  // not scored
  slowdown = s;
  if (s > config.threshold) {
    over++;
    under = 0;
  } else {
    under++;
    over = 0;
  }
  if (!named && over >= config.windows) {
    named = true;
    since_step = step - config.windows + 1;
    return true;
  }
  if (named && under >= config.windows) {
    named = false;
    *cleared = true;
  }
  return false;
}

std::vector<StragglerTracker::Change> StragglerTracker::Judge(int64_t step) {
  std::vector<double> compute(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) compute[r] = Median(ranks_[r].compute);
  std::vector<double> pace(replicas_.size());
  for (size_t d = 0; d < replicas_.size(); ++d) pace[d] = Pace(static_cast<int>(d));
  const std::vector<double> rank_slowdown = OverOthers(compute);
  const std::vector<double> replica_slowdown = OverOthers(pace);
  bool cleared = false;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (rank_slowdown[r] <= 0) continue;
    scored_ = true;
    slowdown_[r] = rank_slowdown[r];
    ranks_[r].streak.Judge(rank_slowdown[r], config_, step, &cleared);
  }
  for (size_t d = 0; d < replicas_.size(); ++d) {
    replicas_[d].Judge(replica_slowdown[d], config_, step, &cleared);
  }
  // Who is named now: ranks on their own; a named replica's ranks when none of them is.
  std::map<int, Named> now;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const Streak& s = ranks_[r].streak;
    if (s.named) now[static_cast<int>(r)] = Named{static_cast<int>(r), s.slowdown, s.since_step};
  }
  for (int d = 0; d < grid_.dp(); ++d) {
    const Streak& s = replicas_[static_cast<size_t>(d)];
    if (!s.named) continue;
    bool own = false;
    for (int t = 0; t < grid_.tp; ++t) own = own || now.count(grid_.rank(d, t)) > 0;
    if (own) continue;
    for (int t = 0; t < grid_.tp; ++t) {
      now[grid_.rank(d, t)] = Named{grid_.rank(d, t), s.slowdown, s.since_step};
    }
  }
  std::vector<Change> changes;
  for (const auto& [rank, n] : now) {
    if (!named_.count(rank)) changes.push_back(Change{rank, true, n.slowdown, step, n.since_step});
  }
  for (const auto& [rank, n] : named_) {
    if (!now.count(rank)) {
      changes.push_back(
          Change{rank, false, slowdown_[static_cast<size_t>(rank)], step, n.since_step});
    }
  }
  named_ = std::move(now);
  return changes;
}

std::vector<StragglerTracker::Named> StragglerTracker::named() const {
  std::vector<Named> out;
  for (const auto& [rank, n] : named_) out.push_back(n);
  return out;
}

std::vector<int> StragglerTracker::Split(const std::vector<double>& pace, int n) {
  const int dp = static_cast<int>(pace.size());
  std::vector<int> split(pace.size(), 1);
  // (time with one more, dp rank): the smallest first, ties to the lower rank.
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> next;
  for (int d = 0; d < dp; ++d) next.push({2 * pace[static_cast<size_t>(d)], d});
  for (int64_t left = static_cast<int64_t>(n - 1) * dp; left > 0; --left) {
    const int d = next.top().second;
    next.pop();
    const size_t i = static_cast<size_t>(d);
    split[i]++;
    next.push({(split[i] + 1) * pace[i], d});
  }
  return split;
}

std::vector<int> StragglerTracker::SplitFor(int n) {
  const int dp = grid_.dp();
  if (dp < 2 || n < 2) return {};
  if (split_n_ != n) {  // chosen for another window length: start from even
    split_.clear();
    split_n_ = n;
  }
  std::vector<double> pace(static_cast<size_t>(dp), 0.0);
  for (int d = 0; d < dp; ++d) {
    pace[static_cast<size_t>(d)] = Pace(d);
    if (pace[static_cast<size_t>(d)] <= 0) return split_;  // not measured yet: keep what is
  }
  const std::vector<int> even(static_cast<size_t>(dp), n);
  const std::vector<int>& current = split_.empty() ? even : split_;
  std::vector<int> best = Split(pace, n);
  if (WindowTime(best, pace) <= WindowTime(current, pace) * (1.0 - kMinGain)) {
    split_ = best == even ? std::vector<int>() : std::move(best);
  }
  return split_;
}

}  // namespace latchkey
