"""latchkey's synthetic data source (docs/data.md), for the peers to read the same samples."""

MASK64 = (1 << 64) - 1


def split_mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def synthetic_sample(seed, k, seq, vocab):
    """Sample k of latchkey's synthetic source: seq + 1 tokens."""
    h = split_mix64((seed * 0x100000001B3 + k) & MASK64)
    start = h % vocab
    stride = 1 + ((h >> 32) % 7)
    return [(start + stride * i) % vocab for i in range(seq + 1)]
