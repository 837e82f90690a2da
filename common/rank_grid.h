// The one DP x TP rank grid, shared by the coordinator, the workers and the comm layer:
//   rank = dp_rank * tp + tp_rank.
// TP groups hold consecutive ranks; DP groups hold the ranks with the same tp_rank.
#ifndef LATCHKEY_COMMON_RANK_GRID_H_
#define LATCHKEY_COMMON_RANK_GRID_H_

namespace latchkey {

struct RankGrid {
  int world_size = 1;
  int tp = 1;

  // True when world_size is a positive multiple of tp.
  constexpr bool valid() const { return world_size >= 1 && tp >= 1 && world_size % tp == 0; }
  constexpr int dp() const { return world_size / tp; }
  constexpr int tp_rank(int rank) const { return rank % tp; }
  constexpr int dp_rank(int rank) const { return rank / tp; }
  constexpr int rank(int dp_rank, int tp_rank) const { return dp_rank * tp + tp_rank; }
  constexpr bool contains(int rank) const { return rank >= 0 && rank < world_size; }
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_RANK_GRID_H_
