"""The README.md model card written beside every saved model: its architecture, size, config and results."""

from __future__ import annotations

import json

RESULT_LABELS = {
    "val_bpb": "validation bits per byte", "val_rate": "boundary rate (boundaries per byte)",
    "val_bytes_per_chunk": "bytes per chunk", "val_space_align": "whitespace alignment",
    "step": "training steps", "bytes": "training bytes seen", "bpb": "training bits per byte (last log)",
}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def model_card(full: dict, results: dict, n_params: int, architecture: str, name: str) -> str:
    m = full["model"]
    if m["arch"] == "hourglass":
        rule = m["chunker"] + (f" (policy window w={m['policy_window']})" if m["chunker"] == "rl" else "")
        shape = [("boundary rule", rule), ("target rate", m["target_rate"]),
                 ("byte level", f"d={m['d_byte']}, {m['encoder_layers']} encoder + {m['decoder_layers']} decoder "
                                f"layers, sliding window {m['window']}"),
                 ("chunk level", f"d={m['d_chunk']}, {m['main_layers']} layers, full causal attention")]
        what = ("a byte-level hierarchical language model: an encoder over bytes, a boundary rule that "
                "decides where each chunk ends, a main network over the chunks and a decoder back to bytes")
        if m["chunker"] == "rl":
            what += "; the boundaries are drawn by a policy trained with reinforcement learning"
    elif m["arch"] == "flat":
        shape = [("layers", f"{m['flat_layers']} x d={m['d_chunk']}")]
        what = "a flat byte-level transformer (rltok's non-hierarchical reference)"
    else:
        shape = [("layers", f"{m['flat_layers']} x d={m['d_chunk']}"), ("tokenizer", "BPE, stored in the weights")]
        what = "a BPE-token transformer (rltok's tokenized reference; bpb over the bytes its tokens cover)"
    rows = [("architecture", architecture), ("parameters", f"{n_params / 1e6:.2f}M"), *shape,
            ("max sequence", f"{m['max_seq_len']} bytes"), ("vocabulary", "256 bytes + specials (no tokenizer)"
                                                             if m["arch"] != "bpe_token" else "BPE tokens")]
    lines = ["---", "library_name: rltok", "license: mit", "pipeline_tag: text-generation", "tags:",
             "- rltok", "- byte-level", "- tokenizer-free" if m["arch"] != "bpe_token" else "- bpe",
             "- text-generation", "---", "", f"# {name}", "",
             f"This is {what}. Trained with rltok (byte-level language models that learn their "
             "own tokenization).", "", "## Model", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    lines += ["", "## Results", ""]
    if results:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {RESULT_LABELS.get(k, k)} | {_fmt(v)} |" for k, v in results.items()]
        if "val_bpb" in results:
            lines += ["", "bpb = total nats over predicted bytes / (bytes x ln 2) on held-out data; read it "
                          "together with the achieved boundary rate."]
    else:
        lines += ["No evaluation results were recorded with this export."]
    train = {k: v for k, v in full.items() if k != "model"}
    lines += ["", "## Training configuration", ""]
    if train:
        data = full.get("data", {}).get("train")
        t = full.get("train", {})
        if t:
            lines += [f"Data: `{data}`; {t.get('max_steps')} steps of batch {t.get('batch_size')} x "
                      f"{t.get('seq_len')} bytes per rank (x grad_accum {t.get('grad_accum')}), lr {t.get('lr')}, "
                      f"dtype {t.get('dtype')}.", ""]
    else:
        lines += ["Only the model configuration was saved with this export.", ""]
    lines += ["```json", json.dumps(full, indent=2), "```", "", "## Usage", "", "```python",
              "from rltok import from_pretrained", "",
              f'model = from_pretrained("{name}")  # a local folder or a Hub repo id',
              'print(model.generate("def main():", max_new_bytes=64, temperature=0.8).text)' if m["arch"] != "bpe_token"
              else "# score bytes: model(idx).byte_nll", "```", "",
              "Command line: `rltok generate -c <folder> \"prompt\"`, `rltok eval -c <folder> --data <text>`; "
              "lm-evaluation-harness: `rltok lm-eval --model_args pretrained=<folder> --tasks <tasks>`.", ""]
    return "\n".join(lines)
