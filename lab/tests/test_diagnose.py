"""`python -m rltok_lab diagnose` (rltok_lab.diagnose): the gradient estimators' variance, SNR and
alignment per variant; small batches, refused flags and outputs in one error line, and a planted
pickle in the checkpoint it reads runs no code."""

from __future__ import annotations

import json

import pytest

from rltok.config import load_config
from rltok_lab.cli import main
from test_boundary_learning import DATA
from test_hardening import trained  # noqa: F401  (the fixture: a tiny rl-chunker run and its data file)
from test_untrusted_folders import CHECKPOINT_FILES, planted_copy


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_user_error(capsys, argv, *messages) -> None:
    """Exit 2 and exactly one `error:` line holding each of `messages`."""
    code, _, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(m in lines[0] for m in messages), lines[0]


def test_diagnose_compares_flips_with_the_score_function_whatever_the_checkpoint_trained_with():
    """A checkpoint trained with flips: the "reference" row and the reference gradient must still
    be the score function, and the flips rows pay for their extra pass."""
    from rltok.config import ObjectiveConfig
    from rltok.model.factory import build_model
    from rltok_lab.diagnose import VARIANTS, diagnose

    assert all("estimator" in spec for spec in VARIANTS.values())
    cfg = load_config("test")
    model = build_model(cfg.model)
    x = DATA[:8 * 65].long().view(8, 65)
    base = ObjectiveConfig(estimator="flips")
    res = diagnose(model, x[:, :-1], x[:, 1:], base, 0.2, variants=["reference", "flips/16"], n_estimates=3,
                   n_reference=2, log=lambda m: None)
    rows = res["variants"]
    assert rows["flips/16"]["train_flops_per_byte"] > rows["reference"]["train_flops_per_byte"]
    assert rows["flips/16"]["snr_per_flop_vs_reference"] is None or \
        rows["flips/16"]["snr_per_flop_vs_reference"] < rows["flips/16"]["snr_vs_reference"]


@pytest.mark.parametrize("argv", [["--batch", "2"], ["--batch", "4", "--reference-group", "2"],
                                  ["--batch", "3", "--reference-group", "3"]])
def test_diagnose_small_batches_run(trained, capsys, tmp_path, argv):
    folder, data = trained
    code, out, err = run(capsys, "diagnose", "-c", folder, "--data", data, "--seq-len", "32", "--estimates", "2",
                         "--reference", "1", "--out", tmp_path / "d.json", *argv)
    assert code == 0, err
    result = json.loads((tmp_path / "d.json").read_text())
    batch = int(argv[1])
    assert result["batch"][0] == batch and "reference" in result["variants"]
    if batch % 4:
        assert "group K=4" in result["skipped"] and "skipping 'group K=4'" in err
    assert "| reference |" in out


def test_diagnose_refuses_a_named_variant_that_does_not_fit_the_batch(trained, capsys):
    folder, _ = trained
    assert_user_error(capsys, ["diagnose", "-c", folder, "--batch", "2", "--variants", "group K=4"],
                      "multiple of its group size 4")
    assert_user_error(capsys, ["diagnose", "-c", folder, "--reference-group", "1"], "--reference-group must be >= 2")
    assert_user_error(capsys, ["diagnose", "--estimates", "1"], "--estimates")


def test_diagnose_checks_its_output_before_computing(trained, capsys, tmp_path, monkeypatch):
    import rltok.cli.model_commands as model_commands

    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(model_commands, "load_checkpoint", None, raising=False)  # nothing may be loaded
    assert_user_error(capsys, ["diagnose", "-c", trained[0], "--out", tmp_path / "afile" / "d.json"], "is a file")
    assert_user_error(capsys, ["diagnose", "-c", trained[0], "--out", tmp_path], "is a folder")


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_planted_pickle_in_the_checkpoint_diagnose_reads_runs_no_code(trained, tmp_path, capsys, name, how):
    folder, ckpt, marker = planted_copy(trained[0], tmp_path, name, how)
    for target in (folder, ckpt):
        code, _, err = run(capsys, "diagnose", "-c", target, "--objective", "lexicon", "--batch", "2",
                           "--estimates", "2", "--reference", "1", "--reference-group", "2")
        assert not marker.exists(), "diagnose ran code from a planted pickle"
        assert code in (0, 2), err
        if code == 2:
            assert err.strip().splitlines()[-1].startswith("error: "), err


def test_the_estimator_diagnostic_measures_a_settled_rule_as_the_policy_it_stopped_at(tmp_path):
    from rltok.training.trainer import Trainer
    from rltok_lab.estimator_snr import own_estimator
    from test_boundary_learning import corpus
    from test_policy_settle import cfg

    trainer = Trainer(cfg(tmp_path, "train.max_steps=4", "objective.policy_until=0.5"), corpus=corpus(), quiet=True)
    trainer.fit()
    assert trainer.model.chunker.is_settled
    x, y = trainer.sampler.next()
    d = own_estimator(trainer.model, x, y, trainer.cfg.objective, n_estimates=4, n_reference=4)
    assert d["snr"] >= 0 and trainer.model.chunker.is_settled  # the model itself untouched
