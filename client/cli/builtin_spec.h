// The job bare `latchkey up` runs: the demo model of examples/demo.json (GPTBigCode with
// multi-query attention, TP 2 over two local workers; vocab 256 here, the synthetic source's,
// where the demo's BPE has 4096) for 40 steps on the seeded synthetic data source, so it needs
// no file and runs the same from any folder. Synthetic sequences are learnable, so the loss falls
// visibly within those steps. Like the demo it warms the learning rate up over 5 steps and
// decays it on a cosine; it has no evaluation, which needs held-out data (examples/demo.json
// evaluates on its dataset's validation split).
#ifndef LATCHKEY_CLIENT_CLI_BUILTIN_SPEC_H_
#define LATCHKEY_CLIENT_CLI_BUILTIN_SPEC_H_

namespace latchkey::cli {

inline constexpr char kBuiltInJobSpec[] = R"({
  "model": {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 128, "n_head": 8,
            "vocab_size": 256, "n_positions": 128, "multi_query": true},
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 0},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": 40, "warmup_num_steps": 5, "warmup_type": "linear"}},
  "tensor_parallel": {"autotp_size": 2},
  "latchkey": {"seq_len": 128, "steps": 40, "seed": 1, "world_size": 2, "kv_reduce": "auto",
               "data": {"synthetic": {"seed": 1}}}
}
)";

}  // namespace latchkey::cli

#endif  // LATCHKEY_CLIENT_CLI_BUILTIN_SPEC_H_
