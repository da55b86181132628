"""Hub-compatible models: save_pretrained -> from_pretrained gives identical logits for every
kind of model build_model makes (RL hierarchy, the BPE rule whose tokenizer lives in the
weights, the flat and BPE-token references), a model card with config and results, repo ids
through huggingface_hub, `rltok export`, and exported folders usable wherever a checkpoint is."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.training.loading import load_checkpoint
from rltok.cli import main
from rltok.config import Config, RLChunkerSettings, load_config
from rltok.model.pretrained import PretrainedError, save_pretrained
from rltok.training.loading import from_pretrained
from rltok.model import FlatByteLM, HourglassLM
from rltok.model.factory import build_model

TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox\n" % (i, i) for i in range(150))
TRAIN = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)


def logits_of(model, x):
    model.eval()
    with torch.no_grad():
        out = model(x, mode="greedy") if not hasattr(model, "tokenizer") else model(x)
    return out.logits if out.logits is not None else out.byte_nll


@pytest.mark.parametrize("kw", [dict(chunker=RLChunkerSettings(window=3)), dict(chunker="bpe", target_rate=0.4),
                                dict(arch="flat", flat_layers=2), dict(arch="bpe_token", flat_layers=1, target_rate=0.4)],
                         ids=["hourglass-rl", "hourglass-bpe", "flat", "bpe_token"])
def test_save_then_load_gives_identical_logits(tmp_path, kw):
    cfg = tiny_model_config(**kw)
    model = randomize_(build_model(cfg, train_bytes=TRAIN), scale=0.05)
    x = TRAIN[:96].long().view(2, 48)
    ref = logits_of(model, x)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = from_pretrained(tmp_path / "m")
    assert type(loaded) is type(model) and not loaded.training
    assert torch.equal(logits_of(loaded, x), ref)
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    if kw.get("chunker") == "bpe":  # the tokenizer came back from the uint8 buffer
        assert loaded.chunker.tokenizer.to_str() == model.chunker.tokenizer.to_str()


def test_model_card_holds_config_and_results(tmp_path):
    cfg = load_config("test")
    model = build_model(cfg.model)
    save_pretrained(model, tmp_path / "card", config=cfg,
                    results={"val_bpb": 1.2345, "val_rate": 0.2, "chunk_length_hist": [1, 2], "bad": float("nan")})
    card = (tmp_path / "card" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: rltok")
    assert "| validation bits per byte | 1.234 |" in card and "| boundary rate (boundaries per byte) | 0.2 |" in card
    assert '"d_chunk": 64' in card and '"max_steps": 20' in card  # the training config
    meta = json.loads((tmp_path / "card" / "config.json").read_text())
    assert meta["model_type"] == "rltok" and meta["architecture"] == "HourglassLM"
    assert meta["results"] == {"val_bpb": 1.2345, "val_rate": 0.2}  # lists and nan left out
    assert meta["num_parameters"] == model.num_params()
    loaded, full, _ = from_pretrained(tmp_path / "card", return_config=True)
    assert full.to_dict() == cfg.to_dict()
    # no results known: the card says so
    save_pretrained(model, tmp_path / "bare")
    assert "No evaluation results" in (tmp_path / "bare" / "README.md").read_text()


def test_class_methods_check_the_model_kind(tmp_path):
    model = build_model(tiny_model_config(arch="flat", flat_layers=1))
    model.save_pretrained(tmp_path / "flat")
    assert isinstance(FlatByteLM.from_pretrained(tmp_path / "flat"), FlatByteLM)
    with pytest.raises(PretrainedError, match="not a HourglassLM"):
        HourglassLM.from_pretrained(tmp_path / "flat")


def test_repo_ids_go_through_huggingface_hub(tmp_path, monkeypatch):
    import huggingface_hub

    model = build_model(tiny_model_config())
    model.save_pretrained(tmp_path / "snap")
    calls = []

    def fake_snapshot(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    loaded = from_pretrained("someone/rltok-tiny", revision="main")
    assert calls[0][0] == "someone/rltok-tiny" and calls[0][1]["revision"] == "main"
    assert "model.safetensors" in calls[0][1]["allow_patterns"]
    assert isinstance(loaded, HourglassLM)

    def offline(repo_id, **kw):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(PretrainedError, match="cannot fetch 'someone/missing'.*no network"):
        from_pretrained("someone/missing")
    with pytest.raises(PretrainedError, match="not a folder"):
        from_pretrained(str(tmp_path / "nowhere"))  # a path that does not exist is never a repo id


def test_export_cli_and_exported_folder_loads_like_a_checkpoint(tmp_path, capsys):
    from rltok.training.trainer import Trainer

    data = tmp_path / "data.txt"
    data.write_bytes(TEXT)
    cfg = load_config("test", overrides=[f"data.train={data}", f"train.out_dir={tmp_path / 'run'}", "train.max_steps=4",
                                         "train.eval_every=4", "train.log_every=2", "train.device=cpu"])
    result = Trainer(cfg, quiet=True).fit()
    assert main(["export", "-c", str(tmp_path / "run"), "--out", str(tmp_path / "exported")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 4 and summary["val_bpb"] == pytest.approx(result.val["bpb"])
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "validation bits per byte" in card and str(data) in card
    ckpt_model = load_checkpoint(tmp_path / "run")[0]
    model, loaded_cfg, state, where = load_checkpoint(tmp_path / "exported")  # eval/generate/segment accept it
    assert state is None and loaded_cfg.to_dict() == Config.from_dict(cfg.to_dict()).to_dict()
    x = TRAIN[:64].long().view(1, 64)
    assert torch.equal(logits_of(model, x), logits_of(ckpt_model, x))
    assert main(["export", "-c", str(tmp_path / "run")]) == 2  # neither --out nor --push-to-hub
