"""The models' convenience methods, kept out of rltok.model so the model package stays a leaf:
it imports nothing from rltok.training.hub, which imports the models.

    model.save_pretrained(folder, config, ...)    rltok.training.hub.save_pretrained(model, folder, ...)
    model.push_to_hub(repo_id, ...)               rltok.training.hub.push_to_hub(model, repo_id, ...)
    HourglassLM.from_pretrained(path_or_repo)     rltok.training.hub.from_pretrained, checked to hold that class

On HourglassLM, FlatByteLM and BPETokenLM (generate is defined on the classes). rltok/__init__.py calls install() once, so the methods exist wherever the classes
can be imported; each loads its module (rltok.training.hub) on its first call.
"""

from __future__ import annotations

from pathlib import Path

from rltok.config import Config, ModelConfig
from rltok.model.flat import FlatByteLM
from rltok.model.hourglass import HourglassLM
from rltok.model.token_lm import BPETokenLM


def save_pretrained(self, save_directory: str | Path, config: Config | ModelConfig | None = None,
                    results: dict | None = None) -> Path:
    """Weights, config.json and a model card in `save_directory`. See rltok.training.hub.save_pretrained."""
    from rltok.training.hub import save_pretrained as save_pretrained_

    return save_pretrained_(self, save_directory, config, results)


def push_to_hub(self, repo_id: str, **kwargs) -> str:
    """save_pretrained, then upload to a Hub repo. See rltok.training.hub.push_to_hub."""
    from rltok.training.hub import push_to_hub as push_to_hub_

    return push_to_hub_(self, repo_id, **kwargs)


def from_pretrained(cls, name_or_path: str | Path, **kwargs):
    """The model saved in a folder or Hub repo, which must be a `cls`. See rltok.training.hub.from_pretrained."""
    from rltok.training.hub import PretrainedError
    from rltok.training.hub import from_pretrained as from_pretrained_

    model = from_pretrained_(name_or_path, **kwargs)
    got = model[0] if isinstance(model, tuple) else model
    if not isinstance(got, cls):
        raise PretrainedError(f"{name_or_path} holds a {type(got).__name__}, not a {cls.__name__}; "
                              "use rltok.training.hub.from_pretrained to load whatever it holds")
    return model


def install() -> None:
    for cls in (HourglassLM, FlatByteLM, BPETokenLM):
        cls.save_pretrained = save_pretrained
        cls.push_to_hub = push_to_hub
        cls.from_pretrained = classmethod(from_pretrained)
