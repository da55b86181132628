import pytest
import torch

from rltok.config import ModelConfig


def tiny_model_config(**kw) -> ModelConfig:
    base = dict(d_byte=32, d_chunk=48, n_heads_byte=2, n_heads_chunk=2, encoder_layers=1, main_layers=1,
                decoder_layers=1, window=8, max_seq_len=256)
    base.update(kw)
    return ModelConfig(**base)


def straight_and_resumed(make_cfg, tmp_path, stop_at: int, corpus):
    """Train one config twice: straight through (in tmp_path/a), and stopped after `stop_at`
    steps (in tmp_path/b), then resumed from that checkpoint. The two must end with equal weights
    (a resume continues exactly); both trainers are returned for checks of their other state.
    make_cfg(out_dir) -> Config; corpus() -> the training Corpus."""
    from rltok.training.trainer import Trainer

    full = Trainer(make_cfg(tmp_path / "a"), corpus=corpus(), quiet=True)
    full.fit()
    Trainer(make_cfg(tmp_path / "b"), corpus=corpus(), quiet=True).fit(stop_at=stop_at)
    resumed = Trainer(make_cfg(tmp_path / "b"), corpus=corpus(), resume=True, quiet=True)
    resumed.fit()
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    return full, resumed


def randomize_(model: torch.nn.Module, scale: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Give every parameter (including the zero-initialised policy weights) a random value, so
    tests exercise paths that a fresh init would leave inert."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


@pytest.fixture(autouse=True)
def _threads():
    # tiny models run fastest on one thread, and stay fast when the machine is busy
    torch.set_num_threads(1)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def forks():
    """A multiprocessing context whose processes are forked from one server that imported torch and
    the rltok modules the tests' children use: each child is a process of its own (SIGKILL ends it
    as it ends any), without the seconds of imports a fresh interpreter spends. If this process
    started the server before, without these modules, its children import them themselves."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rltok.model", "rltok.model.pretrained", "rltok.training.checkpoint",
                                "rltok.data.prepare", "rltok.data.shards"])
    return ctx


def wait_for_ranks(proc, timeout: float = 240) -> str:
    """The output of a torchrun launched in its own session, once every rank exited cleanly; a
    hung launch is killed with all its workers and fails the test."""
    import os
    import signal
    import subprocess

    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the 2-rank run hung:\n" + out.decode(errors="replace")[-4000:])
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]
    return out.decode(errors="replace")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`rltok ARGV` in this process: (exit code, stdout, stderr); argparse's own exits included."""
    from rltok.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_user_error(capsys, argv, *messages) -> str:
    """The command ends with exit 2 and exactly one `error:` line holding each of `messages`."""
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for m in messages:
        assert m in lines[0], lines[0]
    return lines[0]


def corpus_folder(tmp_path, name: str = "data"):
    """A prepared-corpus folder (train/val/test files) of word salad, `tmp_path / name`."""
    import random

    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()
    rng = random.Random(0)
    folder = tmp_path / name
    folder.mkdir()
    for split, n in (("train", 6000), ("val", 600), ("test", 600)):
        (folder / f"{split}.txt").write_text(" ".join(rng.choice(words) for _ in range(n)))
    return folder

