#include "worker/model/philox.h"

namespace latchkey::philox {

void FillKeepMask(const DropoutDraw& draw, const int64_t* positions, int64_t rows, bool* out) {
  const Key key = DropoutKey(draw.seed);
  const uint32_t threshold = KeepThreshold(draw.p);
  const int64_t n = draw.elements;
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t h = 0; h < draw.heads; ++h) {
      const uint32_t word = StreamWord(draw.site, draw.layer, draw.first_head + h);
      bool* row = out + (b * draw.heads + h) * n;
      // One Philox call per 4 elements; the counter's words 1-3 are fixed for the (row, head),
      // so only word 0 changes in the loop.
      Counter c = DropoutCounter(positions[b], word, 0);
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        c[0] = static_cast<uint32_t>(i >> 2);
        const Counter x = Philox4x32(c, key);
        row[i] = Keep(x[0], threshold);
        row[i + 1] = Keep(x[1], threshold);
        row[i + 2] = Keep(x[2], threshold);
        row[i + 3] = Keep(x[3], threshold);
      }
      if (i < n) {  // the tail: the first n - i lanes of the last counter
        c[0] = static_cast<uint32_t>(i >> 2);
        const Counter x = Philox4x32(c, key);
        for (int lane = 0; i < n; ++i, ++lane) row[i] = Keep(x[lane], threshold);
      }
    }
  }
}

}  // namespace latchkey::philox
