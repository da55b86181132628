"""Models that load where people work: `save_pretrained` / `from_pretrained` in the Hugging Face
Hub layout, and a generated model card.

    <folder>/
        model.safetensors   weights (no pickle); BPE tokenizers travel inside as uint8 buffers
        config.json         {"model_type": "rltok", "architecture": ..., "model": {...},
                             "objective"/"data"/"train": {...} when known, "results": {...}}
        README.md           model card: architecture, training config, results

`from_pretrained` takes a local folder (no network needed) or a Hub repo id, fetched with
`huggingface_hub.snapshot_download`. Any model `rltok.model.factory.build_model` makes works:
the hierarchical HourglassLM with every boundary rule, FlatByteLM and BPETokenLM.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch

from .config import Config, ConfigError, ModelConfig
from .model.factory import build_model

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
META_KEYS = ("model_type", "rltok_version", "architecture", "num_parameters", "results")


class PretrainedError(ValueError):
    """A folder or repo that does not hold an rltok model."""


def _version() -> str:
    from . import __version__

    return __version__


def model_config_of(model: torch.nn.Module) -> ModelConfig:
    cfg = getattr(model, "model_config", None) or getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise PretrainedError(f"{type(model).__name__} carries no ModelConfig; build it with "
                              "rltok.model.factory.build_model, or pass config=")
    return cfg


def _clean(results: dict | None) -> dict:
    """JSON-safe scalar results (histograms and non-finite values left out)."""
    out = {}
    for k, v in (results or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        out[k] = v
    return out


def save_pretrained(model: torch.nn.Module, save_directory: str | Path, config: Config | ModelConfig | None = None,
                    results: dict | None = None, name: str | None = None) -> Path:
    """Write weights, config.json and a model card to `save_directory` (created if needed).
    `config` is the full training Config (its sections go into config.json and the card) or
    just a ModelConfig (default: the model's own); `results` e.g. {"val_bpb": 1.28, "val_rate": 0.2}."""
    from safetensors.torch import save_file

    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(config, Config):
        full: dict[str, Any] = config.to_dict()
    else:
        full = {"model": dataclasses.asdict(config if isinstance(config, ModelConfig) else model_config_of(model))}
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())
    meta = {"model_type": "rltok", "rltok_version": _version(), "architecture": type(model).__name__,
            "num_parameters": n_params, "results": _clean(results)}
    save_file(state, out / WEIGHTS, metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps({**meta, **full}, indent=2) + "\n")
    (out / CARD).write_text(model_card(full, meta["results"], n_params, type(model).__name__, name or out.name))
    return out


def is_pretrained_dir(path: str | Path) -> bool:
    """A folder written by save_pretrained (not a training checkpoint, which has a manifest)."""
    cfg = Path(path) / CONFIG
    if not cfg.is_file() or not (Path(path) / WEIGHTS).is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == "rltok"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def resolve_pretrained(name_or_path: str | Path, revision: str | None = None, cache_dir: str | None = None,
                       token: str | None = None, local_files_only: bool = False) -> Path:
    """A local folder as it is; anything else is a Hub repo id, downloaded (or taken from the
    local Hub cache) with huggingface_hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    text = str(name_or_path)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise PretrainedError(f"{text} is not a folder holding an rltok model")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PretrainedError(f"{text!r} is not a local folder, and loading from the Hub needs "
                              "huggingface_hub: pip install 'rltok[hub]'") from None
    try:
        return Path(snapshot_download(text, revision=revision, cache_dir=cache_dir, token=token,
                                      local_files_only=local_files_only, allow_patterns=[CONFIG, WEIGHTS, CARD]))
    except Exception as e:  # offline, unknown repo, auth: the library raises many types
        raise PretrainedError(f"cannot fetch {text!r} from the Hugging Face Hub ({type(e).__name__}: {e}); "
                              "for a local folder, check the path") from None


def read_pretrained_config(folder: Path) -> tuple[Config, dict]:
    try:
        data = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{folder} has no {CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PretrainedError(f"{folder / CONFIG} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("model_type") != "rltok" or "model" not in data:
        raise PretrainedError(f"{folder / CONFIG} does not describe an rltok model")
    meta = {k: data.pop(k) for k in META_KEYS if k in data}
    try:
        cfg = Config.from_dict(data)
        if set(data) == {"model"}:  # a bare model export: the other sections are defaults, not a run
            cfg.model.validate()
            return cfg, meta
        return cfg.validate(), meta
    except ConfigError as e:
        raise PretrainedError(f"{folder / CONFIG}: {e}") from None


def from_pretrained(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    revision: str | None = None, cache_dir: str | None = None, token: str | None = None,
                    local_files_only: bool = False, return_config: bool = False):
    """The model saved in a folder or Hub repo, in eval mode on `device` (optionally cast to
    `dtype`); with return_config, (model, Config, metadata)."""
    from safetensors.torch import load_file

    folder = resolve_pretrained(name_or_path, revision, cache_dir, token, local_files_only)
    cfg, meta = read_pretrained_config(folder)
    if not (folder / WEIGHTS).is_file():
        raise PretrainedError(f"{folder} has no {WEIGHTS}")
    try:
        state = load_file(folder / WEIGHTS)
    except Exception as e:  # safetensors raises its own types for damaged files
        raise PretrainedError(f"cannot read {folder / WEIGHTS}: {e}") from None
    model = build_model(cfg.model, state_dict=state)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise PretrainedError(f"{folder}: weights do not match config.json ({e})") from None
    model.to(device=device, dtype=dtype)
    model.eval()
    return (model, cfg, meta) if return_config else model


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
