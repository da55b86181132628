"""`evaluate_run`: one path from a trained run to its held-out numbers. `rltok eval` prints what it
returns, the comparison records what it returns, and it is the pipeline spelled out by hand:
load the checkpoint, cut the split into windows, `evaluate`."""

from __future__ import annotations

import json

import pytest

from conftest import corpus_folder, run_cli
from rltok.data.corpus import load_eval_bytes
from rltok.data.windows import eval_windows
from rltok.eval.evaluate import evaluate
from rltok.training.loading import load_checkpoint


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A tiny rl run trained and evaluated by the comparison: (its record, its run folder, the data)."""
    from rltok.analysis.compare import method_slug, run_one

    tmp = tmp_path_factory.mktemp("evalrun")
    data = corpus_folder(tmp)
    rec = run_one("rl", 0, str(data), tmp / "cmp", budget_flops=1e9, preset="test", eval_split="test",
                  base=["train.threads=1"], max_eval_windows=3, eval_context=5)
    return rec, tmp / "cmp" / f"{method_slug('rl')}_s0", data


def test_it_is_load_windows_evaluate(compared):
    from rltok import evaluate_run

    _, run, data = compared
    got = evaluate_run(run, str(data), "test", max_windows=3, context=5, seed=3, batch_size=2)
    model, cfg, _, ckpt = load_checkpoint(run)
    x, y = eval_windows(load_eval_bytes(str(data), "test"), cfg.train.seq_len, 3, context=5)
    assert got.result == evaluate(model, x, y, batch_size=2, seed=3, context=5)
    assert got.checkpoint == ckpt and got.split == "test" and got.greedy is None
    assert got.x.equal(x) and got.y.equal(y) and not got.model.training


def test_the_comparison_records_what_it_returns(compared):
    from rltok.harness import evaluate_run

    rec, run, data = compared
    got = evaluate_run(run, str(data), "test", max_windows=3, context=5, batch_size=16, seed=0, code_metrics=False,
                       greedy=True)
    ev, greedy = got.result, got.greedy
    assert (rec["bpb"], rec["rate"], rec["eval_bytes"], rec["space_align"]) == (
        ev["bpb"], ev["rate"], ev["bytes"], ev["space_align"])
    assert rec["chunk_length_hist"] == ev["chunk_length_hist"] and rec["eval_context"] == 5
    assert (rec["bpb_greedy"], rec["rate_greedy"]) == (greedy["bpb"], greedy["rate"])


def test_rltok_eval_prints_what_it_returns(compared, capsys):
    from rltok.harness import evaluate_run

    _, run, data = compared
    code, out, _ = run_cli(capsys, "eval", "-c", run, "--data", data, "--split", "test", "--max-windows", "3",
                           "--context", "5", "--hist", "--device", "cpu")
    assert code == 0
    got = evaluate_run(run, str(data), "test", max_windows=3, context=5).summary()
    assert json.loads(out) == {k: round(v, 4) if isinstance(v, float) else v for k, v in got.items()}


def test_by_default_it_reads_the_runs_own_corpus(compared, capsys):
    from rltok.harness import evaluate_run

    _, run, data = compared
    own = evaluate_run(run, split="val", max_windows=2)
    assert own.data == str(data) and own.summary()["split"] == "val"
    assert own.result == evaluate_run(run, str(data), "val", max_windows=2).result
    code, out, err = run_cli(capsys, "eval", "-c", run, "--split", "train", "--max-windows", "2")
    assert code == 0 and json.loads(out)["data"] == str(data)


def test_a_run_is_evaluated_on_the_bytes_its_training_held_out(tmp_path):
    """Trained with a val source of its own and a cap on its source: `evaluate_run` with no data
    scores exactly that val source, and its train split is the capped one it trained on."""
    from rltok import evaluate_run
    from rltok.config import load_config
    from rltok.data.corpus import load_corpus
    from rltok.training.trainer import Trainer

    data = corpus_folder(tmp_path)
    held = tmp_path / "held.txt"
    held.write_bytes(b"a held-out file the run never trains on; " * 20)
    cfg = load_config("test", overrides=[f"data.train={data}", f"data.val={held}", "data.max_bytes=3000",
                                         f"train.out_dir={tmp_path / 'run'}", "train.max_steps=1",
                                         "train.threads=1", "train.eval_every=1"])
    Trainer(cfg, quiet=True).fit()
    val = evaluate_run(tmp_path / "run", split="val", context=1)
    scored = bytes(val.x.flatten().tolist())
    assert scored in held.read_bytes() and len(scored) > 500
    train = evaluate_run(tmp_path / "run", split="train")
    trained = load_corpus(str(data), str(held), max_bytes=3000).train
    assert bytes(train.x[0].tolist()) == bytes(trained[: train.x.shape[1]].tolist())
