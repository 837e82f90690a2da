#!/usr/bin/env python3
"""Text or JSONL -> Megatron indexed dataset (PREFIX.bin + PREFIX.idx), as Megatron-LM's
tools/preprocess_data.py writes it (docs/data.md "Megatron indexed datasets").

Each input document (a whole text file, or one JSONL line's --json-key field) is tokenized with
a Hugging Face `tokenizers` tokenizer (--tokenizer tokenizer.json, or --train-bpe VOCAB: a
byte-level BPE trained on the inputs, no network needed, saved as PREFIX.tokenizer.json), the
EOD token appended, and written as one sequence and one document. The dtype is Megatron's
optimal_dtype(vocab size): uint16 below 65500, else int32. The files are byte-identical to what
megatron-core's IndexedDatasetBuilder writes for the same tokens (add_item + end_document).

Run through scripts/prepare-data (it makes the pinned venv). Exit status 2 on a usage error.
"""
import argparse
import json
import struct
import sys
from array import array

MAGIC = b"MMIDIDX\x00\x00"
# name -> (Megatron's DType code, array typecode, bytes)
DTYPES = {
    "uint8": (1, "B", 1),
    "int8": (2, "b", 1),
    "int16": (3, "h", 2),
    "int32": (4, "i", 4),
    "int64": (5, "q", 8),
    "uint16": (8, "H", 2),
}


def optimal_dtype(vocab_size):
    """megatron.core.datasets.indexed_dataset.DType.optimal_dtype."""
    return "uint16" if vocab_size is not None and vocab_size < 65500 else "int32"


class IndexedDatasetWriter:
    """IndexedDatasetBuilder's bytes: the .bin as the items come, the .idx at finalize."""

    def __init__(self, prefix, dtype):
        self.prefix = prefix
        self.code, self.typecode, self.size = DTYPES[dtype]
        self.bin = open(prefix + ".bin", "wb")
        self.lengths = []
        self.documents = [0]

    def add_item(self, ids):
        a = array(self.typecode, ids)
        if sys.byteorder != "little":
            a.byteswap()
        self.bin.write(a.tobytes())
        self.lengths.append(len(ids))

    def end_document(self):
        self.documents.append(len(self.lengths))

    def finalize(self):
        self.bin.close()
        pointers, p = [], 0
        for n in self.lengths:
            pointers.append(p)
            p += n * self.size
        with open(self.prefix + ".idx", "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", self.code))
            f.write(struct.pack("<Q", len(self.lengths)))
            f.write(struct.pack("<Q", len(self.documents)))
            f.write(struct.pack("<%di" % len(self.lengths), *self.lengths))
            f.write(struct.pack("<%dq" % len(pointers), *pointers))
            f.write(struct.pack("<%dq" % len(self.documents), *self.documents))


def documents(paths, json_key):
    """Yields the text of each document: a JSONL line's json_key, or a whole text file."""
    for path in paths:
        if json_key is not None:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        value = json.loads(line)[json_key]
                    except (ValueError, KeyError, TypeError) as e:
                        raise SystemExit(f"prepare-data: {path}:{n}: no string '{json_key}': {e}")
                    if not isinstance(value, str):
                        raise SystemExit(f"prepare-data: {path}:{n}: '{json_key}' is not a string")
                    yield value
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield f.read()


def train_bpe(paths, json_key, vocab_size, eod):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eod],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents(paths, json_key), trainer=trainer)
    return tok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="prepare-data", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="a Hugging Face tokenizer.json")
    src.add_argument("--train-bpe", type=int, metavar="VOCAB", help="train a byte-level BPE")
    ap.add_argument("--json-key", help="inputs are JSONL; the document is this key's string")
    ap.add_argument("--eod-token", default="<|endoftext|>", help="appended to every document")
    ap.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    ap.add_argument("inputs", nargs="+", help="text files (one document each) or JSONL files")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    if args.train_bpe is not None:
        if args.train_bpe < 257:
            ap.error("--train-bpe needs a vocab of at least 257 (256 bytes and EOD)")
        tok = train_bpe(args.inputs, args.json_key, args.train_bpe, args.eod_token)
        tok.save(args.output_prefix + ".tokenizer.json")
    else:
        tok = Tokenizer.from_file(args.tokenizer)
    eod = tok.token_to_id(args.eod_token)
    if eod is None:
        ap.error(f"--eod-token {args.eod_token!r} is not in the tokenizer's vocabulary")
    vocab = tok.get_vocab_size()
    dtype = optimal_dtype(vocab)
    writer = IndexedDatasetWriter(args.output_prefix, dtype)
    docs = tokens = 0
    for text in documents(args.inputs, args.json_key):
        ids = tok.encode(text, add_special_tokens=False).ids
        if ids:  # preprocess_data.py: an empty document gets no EOD and no sequence
            ids.append(eod)
            writer.add_item(ids)
        writer.end_document()
        docs += 1
        tokens += len(ids)
    writer.finalize()
    print(
        f"prepare-data: {docs} documents, {tokens} tokens, vocab {vocab} ({dtype}), "
        f"EOD {eod} -> {args.output_prefix}.bin/.idx"
    )


if __name__ == "__main__":
    main()
