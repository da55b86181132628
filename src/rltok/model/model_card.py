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
    """The card of a model whose config (`full`, or just its "model" section) names its family;
    the family's class describes itself (`card_facts`)."""
    from rltok.config import FAMILIES

    m = full["model"]
    what, shape, byte_level = FAMILIES.component(m["arch"]).card_facts(m)
    rows = [("architecture", architecture), ("parameters", f"{n_params / 1e6:.2f}M"), *shape,
            ("max sequence", f"{m['max_seq_len']} bytes"), ("vocabulary", "256 bytes + specials (no tokenizer)"
                                                             if byte_level else "BPE tokens")]
    lines = ["---", "library_name: rltok", "license: mit", "pipeline_tag: text-generation", "tags:",
             "- rltok", "- byte-level", "- tokenizer-free" if byte_level else "- bpe",
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
    train = {k: v for k, v in full.items() if k not in ("model", "plugins", "plugin_sources")}
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
    lines += ["```json", json.dumps(full, indent=2), "```", "", "## Usage", ""]
    if full.get("plugins"):  # its components come from code outside rltok, which loading never imports
        sources = full.get("plugin_sources") or {}
        named = ", ".join(f"`{s}`" + (f" (pip package `{sources[s]['distribution']}`)"
                                       if (sources.get(s) or {}).get("distribution") else "")
                          for s in full["plugins"])
        lines += [f"Needs the rltok plugin(s) {named}: install it, or load it first (`--plugin`, "
                  "`rltok.config.load_plugin`; docs/EXTENDING.md).", ""]
    lines += ["```python",
              "from rltok import from_pretrained", "",
              f'model = from_pretrained("{name}")  # a local folder or a Hub repo id',
              'print(model.generate("def main():", max_new_bytes=64, temperature=0.8).text)' if byte_level
              else "# score bytes: model(idx).byte_nll", "```", "",
              "Command line: `rltok generate -c <folder> \"prompt\"`, `rltok eval -c <folder> --data <text>`; "
              "lm-evaluation-harness: `rltok lm-eval --model_args pretrained=<folder> --tasks <tasks>`.", ""]
    return "\n".join(lines)
