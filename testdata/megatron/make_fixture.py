#!/usr/bin/env python3
"""Makes the Megatron-Core oracle fixture that latchkey's sample order is checked against.

With megatron-core itself (requirements.txt: megatron-core, torch, numpy pinned): three indexed
datasets written by megatron-core's IndexedDatasetBuilder (different sizes and dtypes: uint16,
int32, uint8), then for each case the samples megatron-core's GPTDataset / BlendedDataset gives
(BlendedMegatronDatasetBuilder, split 90,5,5), as token ids, into expected.json. The CI test
(worker/data/megatron_order_test.cc) compares latchkey's samples against it without
megatron-core. Deterministic: rerunning writes the same files.

Usage: make_fixture.py [OUT_DIR]   (default: this folder)
"""
import json
import os
import sys
import tempfile

import numpy
import torch
import torch.distributed

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

VOCAB = 1000
EOD = 0


class Tokenizer:
    """What GPTDataset asks of a tokenizer here: the EOD id (no pad: nothing is padded)."""

    eod = EOD
    vocab_size = VOCAB
    unique_identifiers = {"class": "FixtureTokenizer", "eod": EOD, "vocab_size": VOCAB}


def write_dataset(prefix, dtype, num_documents, max_length, vocab, seed):
    """Documents of random length and ids, each closed by EOD as preprocess_data.py does."""
    rng = numpy.random.RandomState(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(num_documents):
        n = int(rng.randint(1, max_length + 1))
        ids = rng.randint(1, vocab, size=n).tolist() + [EOD]
        builder.add_item(torch.tensor(ids, dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def tokens_per_split(prefix):
    """Tokens of the train split (the first 90% of sequences), for 'two epochs' worth'."""
    sizes = numpy.fromfile(prefix + ".idx", dtype=numpy.uint8)
    n = int(sizes[18:26].view(numpy.uint64)[0])
    lengths = sizes[34 : 34 + 4 * n].view(numpy.int32)
    end = int(round(0.9 * n))
    return int(lengths[:end].sum())


def samples(prefixes, weights, seq_length, seed, sizes, cache):
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=(prefixes, weights),
        split="90,5,5",
        path_to_cache=cache,
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        mmap_bin_files=True,
    )
    train, valid, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, config
    ).build()
    out = {}
    for name, ds in (("train", train), ("validation", valid)):
        rows = []
        for k in range(len(ds)):
            item = ds[k]
            text = item["tokens"].tolist() + [int(item["labels"][-1])]
            assert item["labels"][:-1].tolist() == text[1:-1]
            rows.append(text)
        out[name] = {"num_samples": len(ds), "tokens": rows}
        if weights is not None:
            out[name]["dataset_index"] = [int(x) for x in ds.dataset_index]
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1
        )
        datasets = {
            "a_uint16": (numpy.uint16, 60, 50, VOCAB, 1),
            "b_int32": (numpy.int32, 31, 90, VOCAB, 2),
            "c_uint8": (numpy.uint8, 17, 20, 256, 3),
        }
        for name, (dtype, docs, max_len, vocab, seed) in datasets.items():
            write_dataset(os.path.join(out_dir, name), dtype, docs, max_len, vocab, seed)
        cases = []
        for name in datasets:
            prefix = os.path.join(out_dir, name)
            for seq_length in (32, 7):
                per_epoch = (tokens_per_split(prefix) - 1) // seq_length
                # Two epochs' worth; and 1.3 epochs, where the final epoch is shuffled apart.
                for num_samples in (2 * per_epoch, int(1.3 * per_epoch)):
                    cases.append(
                        {
                            "name": f"{name}-s{seq_length}-n{num_samples}",
                            "path_prefix": [name],
                            "weights": None,
                            "seq_length": seq_length,
                            "seed": 1234,
                            "num_samples": num_samples,
                            "eval_samples": 9,
                        }
                    )
        for seq_length, num_samples, seed in ((7, 300, 1234), (32, 120, 7)):
            cases.append(
                {
                    "name": f"blend-s{seq_length}-n{num_samples}",
                    "path_prefix": list(datasets),
                    "weights": [0.5, 0.3, 0.2],
                    "seq_length": seq_length,
                    "seed": seed,
                    "num_samples": num_samples,
                    "eval_samples": 11,
                }
            )
        for i, case in enumerate(cases):
            prefixes = [os.path.join(out_dir, p) for p in case["path_prefix"]]
            sizes = [case["num_samples"], case["eval_samples"], case["eval_samples"]]
            case.update(
                samples(
                    prefixes,
                    case["weights"],
                    case["seq_length"],
                    case["seed"],
                    sizes,
                    os.path.join(tmp, f"cache{i}"),
                )
            )
        torch.distributed.destroy_process_group()
    fixture = {
        "made_by": "testdata/megatron/make_fixture.py with megatron-core "
        + __import__("megatron.core", fromlist=["package_info"]).package_info.__version__,
        "split": "90,5,5",
        "vocab_size": VOCAB,
        "cases": cases,
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
