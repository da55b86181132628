"""Models that load where people work: `save_pretrained` / `from_pretrained` in the Hugging Face
Hub layout, and a generated model card.

    <folder>/
        model.safetensors   weights (no pickle); BPE tokenizers travel inside as uint8 buffers
        config.json         {"model_type": "rltok", "architecture": ..., "model": {...},
                             "objective"/"data"/"train": {...} when known, "results": {...}}
        README.md           model card: architecture, training config, results

This is the one on-disk format of rltok (rltok.checkpoint): a training checkpoint is the same
folder plus trainer.pt and manifest.json, and both functions here are thin wrappers over
rltok.checkpoint's writer and loader. `from_pretrained` takes a model folder, a checkpoint
folder or a run folder (no network needed), or a Hub repo id, fetched with
`huggingface_hub.snapshot_download`. Any model `rltok.model.factory.build_model` makes works:
the hierarchical HourglassLM with every boundary rule, FlatByteLM and BPETokenLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .checkpoint import CARD, CONFIG, WEIGHTS, CheckpointError  # noqa: F401 (names kept for callers)
from .config import Config, ModelConfig


class PretrainedError(CheckpointError, ValueError):
    """A folder or repo that does not hold an rltok model."""


def model_config_of(model: torch.nn.Module) -> ModelConfig:
    from .checkpoint import model_config_of as model_config_of_

    return model_config_of_(model)


def save_pretrained(model: torch.nn.Module, save_directory: str | Path, config: Config | ModelConfig | None = None,
                    results: dict | None = None, name: str | None = None) -> Path:
    """Write weights, config.json and a model card to `save_directory` (created if needed).
    `config` is the full training Config (its sections go into config.json and the card) or
    just a ModelConfig (default: the model's own); `results` e.g. {"val_bpb": 1.28, "val_rate": 0.2}."""
    from .checkpoint import write_model_files

    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    write_model_files(out, model, config, results, name=name or out.name)
    return out


def is_pretrained_dir(path: str | Path) -> bool:
    """A model folder written by save_pretrained (not a training checkpoint, which has a manifest)."""
    from .checkpoint import is_model_dir

    cfg = Path(path) / CONFIG
    if not is_model_dir(Path(path)):
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == "rltok"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def from_pretrained(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    revision: str | None = None, cache_dir: str | None = None, token: str | None = None,
                    local_files_only: bool = False, return_config: bool = False):
    """The model saved in a model folder, a checkpoint folder, a run folder (its newest valid
    checkpoint) or a Hub repo, in eval mode on `device` (optionally cast to `dtype`); with
    return_config, (model, Config, metadata). Raises PretrainedError."""
    from .checkpoint import load

    try:
        got = load(name_or_path, device=device, dtype=dtype, hub=True, revision=revision, cache_dir=cache_dir,
                   token=token, local_files_only=local_files_only)
    except PretrainedError:
        raise
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None
    got.model.eval()
    return (got.model, got.config, got.meta) if return_config else got.model


def push_to_hub(model: torch.nn.Module, repo_id: str, config: Config | ModelConfig | None = None,
                results: dict | None = None, private: bool = False, token: str | None = None,
                commit_message: str = "Upload rltok model") -> str:
    """save_pretrained into a temporary folder and upload it to `repo_id` (needs network and a
    Hub token). Returns the URL of the commit."""
    import tempfile

    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp, config, results, name=repo_id.split("/")[-1])
        info = api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message)
    return str(getattr(info, "commit_url", info))


# ---- model card ------------------------------------------------------------------------------
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
              "from rltok.hub import from_pretrained", "",
              f'model = from_pretrained("{name}")  # a local folder or a Hub repo id',
              'print(model.generate("def main():", max_new_bytes=64, temperature=0.8).text)' if m["arch"] != "bpe_token"
              else "# score bytes: model(idx).byte_nll", "```", "",
              "Command line: `rltok generate -c <folder> \"prompt\"`, `rltok eval -c <folder> --data <text>`; "
              "lm-evaluation-harness: `rltok lm-eval --model_args pretrained=<folder> --tasks <tasks>`.", ""]
    return "\n".join(lines)
