// numpy's legacy RandomState (numpy/random/mtrand.pyx), the parts Megatron-Core's GPTDataset
// uses, reproduced bit for bit: seeding MT19937 from an integer seed (init_genrand, which is
// std::mt19937's seeding) and RandomState.shuffle of a 1-D array (Fisher-Yates from the end,
// each j drawn by random_interval: the smallest all-ones mask >= i, 32-bit draws while i fits
// 32 bits, else 64-bit draws made of two 32-bit ones, high word first, redrawn until <= i).
// Thread-safety: a LegacyRandomState is not thread-safe; use one per thread.
#ifndef LATCHKEY_WORKER_DATA_NUMPY_RANDOM_H_
#define LATCHKEY_WORKER_DATA_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace latchkey {

class LegacyRandomState {
 public:
  // numpy.random.RandomState(seed) for 0 <= seed < 2^32.
  explicit LegacyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t NextUint32() { return static_cast<uint32_t>(mt_()); }
  uint64_t NextUint64() {
    const uint64_t hi = NextUint32();
    return (hi << 32) | NextUint32();
  }

  // numpy's random_interval(max): uniform in [0, max].
  uint64_t Interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (NextUint32() & mask)) > max) {
      }
    } else {
      while ((value = (NextUint64() & mask)) > max) {
      }
    }
    return value;
  }

  // RandomState.shuffle(x) for a 1-D array.
  template <typename T>
  void Shuffle(std::vector<T>* x) {
    for (int64_t i = static_cast<int64_t>(x->size()) - 1; i >= 1; --i) {
      const uint64_t j = Interval(static_cast<uint64_t>(i));
      std::swap((*x)[static_cast<size_t>(i)], (*x)[static_cast<size_t>(j)]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_NUMPY_RANDOM_H_
