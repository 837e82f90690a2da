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
      // so only word 0 changes in the loop. Element g of the stream is lane g mod 4 of counter
      // g / 4, so a draw starting at an element that is not a multiple of 4 begins mid-counter.
      Counter c = DropoutCounter(positions[b], word, 0);
      int64_t g = draw.first_element;
      const int64_t end = draw.first_element + n;
      bool* o = row;
      while (g < end) {
        c[0] = static_cast<uint32_t>(g >> 2);
        const Counter x = Philox4x32(c, key);
        for (int64_t lane = g & 3; lane < 4 && g < end; ++lane, ++g)
          *o++ = Keep(x[lane], threshold);
      }
    }
  }
}

}  // namespace latchkey::philox
