"""Named presets: overrides on top of the defaults, one per scale (`rltok presets` lists them)."""

from __future__ import annotations

from typing import Any

# "tiny" is the CPU default. The CPU presets a user trains with learn boundaries with the lexicon
# recipe; "test" and the GPU-scale presets keep the published one (objective.recipe tells them apart).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"objective": {"recipe": "lexicon"}},
    "small": {  # a CPU comparison scale (rltok compare --preset small): ~1.7M params, ~3x the tiny speed
        "model": {"d_byte": 96, "d_chunk": 192, "n_heads_byte": 3, "n_heads_chunk": 3,
                  "encoder_layers": 1, "main_layers": 3, "decoder_layers": 1, "window": 64},
        "objective": {"recipe": "lexicon"},
    },
    "test": {  # seconds on a CPU: unit tests and smoke runs
        "model": {"d_byte": 32, "d_chunk": 64, "n_heads_byte": 2, "n_heads_chunk": 2,
                  "encoder_layers": 1, "main_layers": 1, "decoder_layers": 1, "window": 16},
        "train": {"seq_len": 64, "batch_size": 4, "max_steps": 20, "warmup_steps": 2,
                  "eval_every": 10, "eval_batches": 2, "checkpoint_every": 10, "log_every": 5},
    },
    # The reference's 147M natural-language model (FineWeb, 6e9 bytes on 4 GPUs). Its exact
    # widths are not published with the numbers we compare against, so we chose a shape that
    # gives HourglassLM 145.3M parameters: byte level 768 wide, 3 encoder + 3 decoder layers
    # with 512-byte sliding windows; chunk level 1024 wide, 8 layers (head dim 64 throughout).
    # At rate 0.2 the chunk network sees 819 chunks per 4096-byte window. batch_size is per
    # rank: 4 ranks x 16 x 4096 = 262k bytes per step, so 23k steps are the reference's 6e9 bytes.
    "nl-147m": {
        "model": {"d_byte": 768, "d_chunk": 1024, "n_heads_byte": 12, "n_heads_chunk": 16,
                  "encoder_layers": 3, "main_layers": 8, "decoder_layers": 3, "window": 512,
                  "max_seq_len": 8192, "target_rate": 0.2},
        "data": {"train": "hf:HuggingFaceFW/fineweb:sample-10BT", "max_bytes": 6_000_000_000},
        "train": {"seq_len": 4096, "batch_size": 16, "max_steps": 23_000, "lr": 6e-4, "warmup_steps": 1000,
                  "dtype": "bf16", "eval_every": 1000, "eval_batches": 16, "log_every": 50,
                  "checkpoint_every": 1000},
    },
    # The reference's 90M code model (CodeParrot): byte level 512 wide (3 + 3 layers, 512-byte
    # windows), chunk level 768 wide, 10 layers: 90.9M parameters; same schedule as nl-147m.
    "code-90m": {
        "model": {"d_byte": 512, "d_chunk": 768, "n_heads_byte": 8, "n_heads_chunk": 12,
                  "encoder_layers": 3, "main_layers": 10, "decoder_layers": 3, "window": 512,
                  "max_seq_len": 8192, "target_rate": 0.2},
        "data": {"train": "hf:codeparrot/codeparrot-clean", "hf_text_field": "content",
                 "max_bytes": 6_000_000_000},
        "train": {"seq_len": 4096, "batch_size": 16, "max_steps": 23_000, "lr": 8e-4, "warmup_steps": 1000,
                  "dtype": "bf16", "eval_every": 1000, "eval_batches": 16, "log_every": 50,
                  "checkpoint_every": 1000},
    },
}

# one line per preset for `rltok presets`
PRESET_NOTES: dict[str, str] = {
    "tiny": "CPU default: a few minutes on 2 cores",
    "small": "a smaller, faster CPU scale for comparisons (rltok compare --preset small)",
    "test": "seconds on a CPU: unit tests and smoke runs",
    "nl-147m": "the reference's 147M natural-language model (FineWeb, bf16, 4 GPUs)",
    "code-90m": "the reference's 90M code model (CodeParrot, bf16, 4 GPUs)",
}
