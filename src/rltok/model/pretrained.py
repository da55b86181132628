"""The model folder, rltok's one on-disk format for a model, in the Hub layout (docs/DISTRIBUTED.md,
"Models that load anywhere"): PretrainedMixin gives every family `save_pretrained`, `push_to_hub` and
`from_pretrained`; model.arch names the class through the FAMILIES registry."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from rltok.config import FAMILIES, Config, ConfigError, ModelConfig
from rltok.config.loading import plugin_sources
from rltok.config.plugins import MissingPlugin
from rltok.model.model_card import model_card
from rltok.version import __version__

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
MODEL_FILES = (WEIGHTS, CONFIG, CARD)  # a model folder; a checkpoint adds trainer.pt and manifest.json
META_KEYS = ("model_type", "rltok_version", "architecture", "num_parameters", "results", "fit_facts")


class CheckpointError(RuntimeError):
    """A checkpoint or model folder that is missing, partial, corrupt or does not match its config."""


class PretrainedError(CheckpointError, ValueError):
    """A folder or repo that does not hold an rltok model."""


# ---- writing ---------------------------------------------------------------------------------
def model_config_of(model: torch.nn.Module) -> ModelConfig:
    cfg = getattr(model, "model_config", None) or getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise PretrainedError(f"{type(model).__name__} carries no ModelConfig; build it with "
                              "rltok.model.factory.build_model, or pass config=")
    return cfg


def family_name(arch: str) -> str:
    """The class name of the family model.arch names (FAMILIES)."""
    return FAMILIES.component(arch).__name__


def _architecture(model: torch.nn.Module | None, arch: str) -> str:
    """The model's class name (FSDP2's dynamic `FSDP<Name>` subclass, made in torch, looked through)."""
    if model is None:
        return family_name(arch)
    return next((c.__name__ for c in type(model).__mro__ if c.__module__ != "builtins"
                 and not c.__module__.startswith("torch.")), type(model).__name__)


def clean_results(results: dict | None) -> dict:
    """JSON-safe scalar results (histograms and non-finite values left out)."""
    return {k: v for k, v in (results or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and not math.isfinite(v))}


def _as_umask_allows(path: Path) -> None:
    """safetensors creates its file 0600; give it the mode every other file of the folder gets."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def write_model_files(folder: Path, model: torch.nn.Module | None, config: Config | ModelConfig | None = None,
                      results: dict | None = None, name: str | None = None,
                      state_dict: dict[str, torch.Tensor] | None = None) -> list[str]:
    """model.safetensors, config.json and README.md in `folder` (which must exist). `config`: the
    full training Config or just a ModelConfig (default: the model's own); `results` e.g.
    {"val_bpb": 1.28}; `state_dict` replaces `model.state_dict()` (a sharded model's, gathered)."""
    if isinstance(config, Config):
        full: dict[str, Any] = config.to_dict()
    else:
        model_cfg = config if isinstance(config, ModelConfig) else model_config_of(model)
        full = {"model": dataclasses.asdict(model_cfg)}
        sources = plugin_sources(Config(model=model_cfg))  # the plugins its components come from
        if sources:
            full.update(plugins=list(sources), plugin_sources=sources)
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    if model is not None:  # DTensor parameters (FSDP) count their full size
        n_params = sum(p.numel() for p in model.parameters())
    else:
        n_params = sum(v.numel() for v in state.values() if v.is_floating_point())
    arch = _architecture(model, full["model"]["arch"])
    meta = {"model_type": "rltok", "rltok_version": __version__, "architecture": arch,
            "num_parameters": n_params, "results": clean_results(results)}
    fit_facts = getattr(model, "fit_facts", None)
    if callable(fit_facts) and fit_facts():  # e.g. the bytes a BPE tokenizer was fitted on
        meta["fit_facts"] = fit_facts()
    save_file(state, folder / WEIGHTS, metadata={"format": "pt"})
    _as_umask_allows(folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps({**meta, **full}, indent=2) + "\n")
    # a folder name or path that is not UTF-8 (any bytes are a valid POSIX name) is shown escaped
    (folder / CARD).write_text(model_card(full, meta["results"], n_params, arch, name or folder.name),
                               encoding="utf-8", errors="backslashreplace")
    return list(MODEL_FILES)


def refuse_run_or_checkpoint(out: str | Path, what: str = "save_pretrained") -> None:
    """A model folder is never written into a training run's folder or a checkpoint, nor inside
    one: it would replace the run's config.json (breaking resume and evaluation) or a checkpoint's
    verified files. A fresh run (its lock, no checkpoint yet) counts."""
    out = Path(out).absolute()
    for folder in (out, *out.parents):
        if (folder / "checkpoints").is_dir() or (folder / "manifest.json").exists() or (folder / "trainer.pt").exists():
            kind = "a run folder" if (folder / "checkpoints").is_dir() else "a checkpoint"
            raise PretrainedError(f"{what} {out} is inside {kind} ({folder}); write the model to a folder of its own")
    if (out / ".lock").exists():
        raise PretrainedError(f"{what} {out} is inside a run folder (a run's lock, no checkpoint yet); write the "
                              "model to a folder of its own")


def save_pretrained(model: torch.nn.Module, save_directory: str | Path, config: Config | ModelConfig | None = None,
                    results: dict | None = None, name: str | None = None) -> Path:
    """write_model_files into `save_directory`, created if needed; never into a run or checkpoint
    folder (refuse_run_or_checkpoint)."""
    out = Path(save_directory)
    refuse_run_or_checkpoint(out)
    out.mkdir(parents=True, exist_ok=True)
    write_model_files(out, model, config, results, name=name or out.name)
    return out


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


# ---- reading ---------------------------------------------------------------------------------
def fetch_from_hub(repo_id: str, revision: str | None = None, cache_dir: str | None = None,
                   token: str | None = None, local_files_only: bool = False) -> Path:
    """The model files of a Hub repo, downloaded (or taken from the local Hub cache)."""
    if repo_id.startswith((".", "/", "~")) or repo_id.count("/") > 1 or "\\" in repo_id:
        raise CheckpointError(f"checkpoint path not found: {repo_id} (not a folder holding an rltok model or run)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{repo_id!r} is not a local folder, and loading from the Hub needs "
                              "huggingface_hub: pip install 'rltok[hub]'") from None
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                      local_files_only=local_files_only, allow_patterns=list(MODEL_FILES)))
    except Exception as e:  # offline, unknown repo, auth: the library raises many types
        raise CheckpointError(f"cannot fetch {repo_id!r} from the Hugging Face Hub ({type(e).__name__}: {e}); "
                              "for a local folder, check the path") from None


def read_config(folder: Path) -> tuple[Config, dict]:
    """(Config, metadata) from a folder's config.json. A bare model export's other sections are
    defaults, not a run, and are not validated."""
    from rltok.config.files import read_json

    path = folder / CONFIG
    if not path.exists():
        raise CheckpointError(f"{folder} has no {CONFIG}")
    # bounded: a config.json nested thousands deep or holding a huge number is one error
    data = read_json(path, "checkpoint config", limit=1 << 20, error=CheckpointError)
    ours = isinstance(data, dict) and data.get("model_type", "rltok") == "rltok"  # older checkpoints: no model_type
    if not ours or not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{path} does not describe an rltok model")
    meta = {k: data.pop(k) for k in META_KEYS if k in data}
    try:
        cfg = Config.from_dict(data)
        if set(data) - {"plugins", "plugin_sources"} == {"model"}:
            cfg.model.validate()
            return cfg, meta
        return cfg.validate(), meta
    except MissingPlugin as e:  # not a bad file: this process lacks what it needs
        raise CheckpointError(str(e.about(str(folder)))) from None
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {folder}: bad {CONFIG} ({e})") from None


Build = Callable[..., torch.nn.Module]  # (ModelConfig, state_dict=...) -> model, e.g. factory.build_model


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """safetensors' load_file, also where the path is not UTF-8 (which load_file refuses)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        from safetensors.torch import load

        with open(path, "rb") as f:
            return load(f.read())
    return load_file(path)


def _refuse_more_than_the_weights(folder: Path, cfg: Config, build: Build,
                                  state: dict[str, torch.Tensor]) -> None:
    """Refuse a config.json (or a tokenizer) describing far more parameters than the weights hold
    before building it: a handed folder's sizes could ask for all of memory. Up to twice the
    weights (plus a million) the strict load names the missing keys instead. Sized on the meta
    device; where that build fails, the real one says why."""
    try:
        with torch.device("meta"):
            planned = build(cfg.model, state_dict=state)
    except Exception:  # noqa: BLE001 - reported by the build that follows
        return
    need = sum(p.numel() for p in planned.parameters())
    have = sum(t.numel() for t in state.values())
    if need > 2 * have + (1 << 20):
        raise CheckpointError(f"checkpoint {folder}: its {CONFIG} describes a model of {need:,} parameters, more "
                              f"than the {have:,} values its {WEIGHTS} holds")


def load_weights(folder: Path, cfg: Config, build: Build, fit_facts: dict | None = None) -> torch.nn.Module:
    """The model config.json describes, made by `build`, with the folder's weights loaded strictly (on
    CPU) and its `fit_facts` restored."""
    try:
        state = _read_safetensors(folder / WEIGHTS)
    except Exception as e:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"checkpoint {folder}: cannot read {WEIGHTS} ({' '.join(str(e).split())[:300]})") from None
    _refuse_more_than_the_weights(folder, cfg, build, state)
    try:
        model = build(cfg.model, state_dict=state)
    except (ValueError, KeyError, RuntimeError) as e:  # e.g. a tokenizer buffer that does not parse
        raise CheckpointError(f"checkpoint {folder}: cannot build the model of its {CONFIG} ({e})") from None
    try:
        # not strict here: the modules' own load hooks first fill what older folders lack (a
        # policy's settled flag), then whatever is still missing or left over is an error
        keys = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes: weights and config.json disagree
        raise CheckpointError(f"checkpoint {folder}: {WEIGHTS} does not match its {CONFIG} "
                              f"({' '.join(str(e).split())})") from None
    missing, unexpected = sorted(keys.missing_keys), sorted(keys.unexpected_keys)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {folder}: {WEIGHTS} does not match its {CONFIG}: "
                              f"missing keys {missing}, unexpected keys {unexpected}")
    if fit_facts and hasattr(model, "set_fit_facts"):
        model.set_fit_facts(fit_facts)
    return model


def model_folder(name_or_path: str | Path, revision: str | None = None, cache_dir: str | None = None,
                 token: str | None = None, local_files_only: bool = False) -> Path:
    """The local folder holding the model files of a path (a file inside it stands for the folder)
    or, when no such path exists, of a Hub repo id."""
    local = Path(name_or_path).expanduser()
    if not local.exists():
        folder = fetch_from_hub(str(name_or_path), revision, cache_dir, token, local_files_only)
        if not ((folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()):
            raise CheckpointError(f"the Hub repo {str(name_or_path)!r} holds no {WEIGHTS} + {CONFIG}")
        return folder
    folder = local.parent if local.is_file() else local
    if not ((folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()):
        raise PretrainedError(f"no {WEIGHTS} + {CONFIG} in {folder}; a training run loads with "
                              "rltok.training.loading (from_pretrained, load_checkpoint)")
    return folder


class PretrainedMixin:
    """save_pretrained / push_to_hub / from_pretrained for the model classes: a subclass names its
    `arch` (ModelConfig.arch) and builds itself in `_from_config`."""

    arch: str
    # what the model reads: its own tokens of the bytes (True: a window's first token is context,
    # scores come per token at its last byte, it does not generate) or the bytes themselves
    reads_tokens = False

    @staticmethod
    def fitted_to_data(cfg: ModelConfig) -> bool:
        """Whether building it fits parts to the training bytes (a tokenizer): then data-parallel
        ranks take rank 0's instead of fitting their own. None by default."""
        return False

    @classmethod
    def from_config(cls, cfg: ModelConfig, train_bytes: torch.Tensor | None = None,
                    state_dict: dict[str, torch.Tensor] | None = None):
        """A fresh model of `cfg`, keeping its config as `model.model_config`. `train_bytes` fits
        data-dependent parts (BPE tokenizers); `state_dict` (from a checkpoint) provides them."""
        cfg.validate()
        if cfg.arch != cls.arch:
            raise ValueError(f"model.arch={cfg.arch} builds a {family_name(cfg.arch)}, not a {cls.__name__}")
        model = cls._from_config(cfg, train_bytes, state_dict)
        model.model_config = cfg
        return model

    @classmethod
    def _from_config(cls, cfg: ModelConfig, train_bytes, state_dict):
        raise NotImplementedError

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def fit_facts(self) -> dict:
        """What its data-fitted parts were fitted on, e.g. {"tokenizer_fit_bytes": n}; kept in config.json."""
        return dict(self.__dict__.get("_fit_facts") or {})

    def set_fit_facts(self, facts: dict) -> None:
        self.__dict__["_fit_facts"] = dict(facts)

    @classmethod
    def unfitted(cls, cfg: ModelConfig, vocab_size: int | None = None):
        """The model of `cfg` fitted to no data, its shape only (factory.planned_model)."""
        return cls._from_config(cfg, None, None)

    def save_pretrained(self, save_directory: str | Path, config: Config | ModelConfig | None = None,
                        results: dict | None = None, name: str | None = None) -> Path:
        """Weights, config.json and a model card in `save_directory` (see write_model_files)."""
        return save_pretrained(self, save_directory, config, results, name)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """save_pretrained, then upload to a Hub repo (see rltok.model.pretrained.push_to_hub)."""
        return push_to_hub(self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, revision: str | None = None, cache_dir: str | None = None,
                        token: str | None = None, local_files_only: bool = False, return_config: bool = False):
        """The model saved in a model folder (a checkpoint folder holds one) or a Hub repo, which
        must be a `cls`, in eval mode on `device` (optionally cast to `dtype`); with return_config,
        (model, Config, metadata). Raises PretrainedError."""
        try:
            folder = model_folder(name_or_path, revision, cache_dir, token, local_files_only)
            cfg, meta = read_config(folder)
            if cfg.model.arch != cls.arch:
                raise PretrainedError(f"{name_or_path} holds a {family_name(cfg.model.arch)}, not a {cls.__name__}; "
                                      "use rltok.training.loading.from_pretrained to load whatever it holds")
            model = load_weights(folder, cfg, cls.from_config, meta.get("fit_facts"))
        except PretrainedError:
            raise
        except CheckpointError as e:
            raise PretrainedError(str(e)) from None
        model.to(device=device, dtype=dtype)
        model.eval()
        return (model, cfg, meta) if return_config else model
