"""The lm-evaluation-harness adapter: loglikelihood / loglikelihood_rolling / generate_until over
UTF-8 bytes and gold-continuation bpb. The methods are tested directly with Instance-like
requests; a real `lm_eval.simple_evaluate` run on small in-memory tasks needs lm_eval, an optional
install for users (pip install 'rltok[eval]') that the dev extra, and so CI, includes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rltok.config import RLChunkerSettings

from conftest import randomize_, tiny_model_config
from rltok.model.generate import generate
from rltok.harness.lm_eval_adapter import RLTokLM, gold_bpb_task, rolling_bpb_task
from rltok.model.factory import build_model

TEXT = b"".join(b"def f%d(x):\n    return x * %d\n" % (i, i) for i in range(120))


def req(*args):
    return SimpleNamespace(args=args)  # what lm_eval's Instance exposes


@pytest.fixture(scope="module", params=["hourglass", "flat"])
def model(request):
    torch.manual_seed(0)
    kw = dict(max_seq_len=40, chunker=RLChunkerSettings(window=2)) if request.param == "hourglass" else dict(arch="flat", flat_layers=1,
                                                                                         max_seq_len=40)
    return randomize_(build_model(tiny_model_config(**kw)), scale=0.05)


def test_loglikelihood_is_batch_invariant_additive_and_windowed(model):
    lm, one = RLTokLM(model=model, batch_size=4), RLTokLM(model=model, batch_size=1)
    reqs = [req("The quick brown", " fox"), req("", "héllo wörld"), req("a" * 30, "b" * 50), req("x", "")]
    got = lm.loglikelihood(reqs)
    assert got[3] == (0.0, True)  # nothing to score
    for (a, _), (b, _) in zip(got, one.loglikelihood(reqs)):  # padding in a batch changes nothing
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
    assert all(ll < 0 for ll, _ in got[:3])
    # log p(a b | c) = log p(a | c) + log p(b | c a), also across the 40-byte window limit
    for c, a, b in [("The quick", " brown", " fox jumps"), ("z" * 20, "y" * 15, "w" * 30)]:
        whole = lm.loglikelihood([req(c, a + b)])[0][0]
        parts = lm.loglikelihood([req(c, a)])[0][0] + lm.loglikelihood([req(c + a, b)])[0][0]
        if len(c + a + b) < 40:
            assert whole == pytest.approx(parts, abs=1e-4)
        else:  # a window holds the most context it can, so it is close but not equal
            assert math.isfinite(whole) and whole == pytest.approx(parts, rel=0.1)
    # rolling = the text after an empty context; bytes are UTF-8
    roll = lm.loglikelihood_rolling([req("héllo wörld"), req(TEXT[:200].decode())])
    assert roll[0] == pytest.approx(got[1][0], abs=1e-5)
    assert roll[1] < 0 and lm.loglikelihood_rolling([req("")]) == [0.0]


def test_greedy_continuations_are_reported_greedy_and_generate_until_stops(model):
    lm = RLTokLM(model=model, batch_size=2)
    prompt = b"def f1(x):\n"
    g = generate(model, prompt, 12, temperature=0, mode="greedy")
    assert lm.loglikelihood([req(prompt, g.output)])[0][1] is True
    other = bytes([(g.output[0] + 1) % 256]) + g.output[1:]
    assert lm.loglikelihood([req(prompt, other)])[0][1] is False
    outs = lm.generate_until([req(prompt.decode(), {"until": ["\n"], "max_gen_toks": 12}),
                              req("x", {"max_gen_toks": 5, "do_sample": False}), req("y", {"until": "zz"})])
    assert outs[0] == g.output.split(b"\n")[0].decode("utf-8", errors="replace")
    assert len(outs[1].encode("utf-8", errors="surrogateescape")) <= 5 * 3  # at most 5 bytes, shown as text
    assert isinstance(outs[2], str)


def test_gold_bpb(model):
    lm = RLTokLM(model=model)
    reqs = [req("2 + 2 =", " 4"), req("The capital of France is", " Paris.")]
    nats = -sum(ll for ll, _ in lm.loglikelihood(reqs))
    assert lm.bpb(reqs) == pytest.approx(nats / (len(" 4") + len(" Paris.")) / math.log(2))


def test_loads_checkpoints_and_pretrained_folders(tmp_path, model):
    model.save_pretrained(tmp_path / "m")
    lm = RLTokLM(pretrained=str(tmp_path / "m"), batch_size="auto", max_batch_size=64)  # lm_eval passes extras
    direct = RLTokLM(model=model).loglikelihood([req("ab", "cd")])
    assert lm.loglikelihood([req("ab", "cd")])[0][0] == pytest.approx(direct[0][0], abs=1e-6)
    with pytest.raises(ValueError, match="pretrained"):
        RLTokLM()


def test_bpe_token_reference_scores_bytes(tmp_path):
    train = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    m = build_model(tiny_model_config(arch="bpe_token", flat_layers=1, target_rate=0.5, max_seq_len=64), train_bytes=train)
    lm = RLTokLM(model=m, batch_size=3)
    ll = lm.loglikelihood([req("def f1(x):", "\n    return x"), req("", TEXT[:150].decode())])
    assert all(math.isfinite(v) and v < 0 for v, _ in ll)
    with pytest.raises(NotImplementedError):
        lm.generate_until([req("x", {})])


def _lm_eval():
    """lm_eval, or a skip where it is not installed; under CI (the dev extra installs it) its absence fails."""
    import os

    if os.environ.get("CI"):
        import lm_eval

        return lm_eval
    return pytest.importorskip("lm_eval")


def test_simple_evaluate_on_local_tasks(model):
    lm_eval = _lm_eval()
    docs = [{"context": "The capital of France is", "continuation": " Paris."},
            {"context": "def f(x):\n    return", "continuation": " x * 2"}]
    lm = RLTokLM(model=model, batch_size=4)
    res = lm_eval.simple_evaluate(model=lm, tasks=[gold_bpb_task(docs), rolling_bpb_task([d["context"] for d in docs])],
                                  bootstrap_iters=0, log_samples=False)["results"]
    gold = res["rltok_gold_bpb"]["bits_per_byte,none"]
    assert gold == pytest.approx(lm.bpb([req(d["context"], d["continuation"]) for d in docs]), rel=1e-6)
    assert 0 < res["rltok_rolling_bpb"]["bits_per_byte,none"] < 20
    assert 0 <= res["rltok_gold_bpb"]["acc,none"] <= 1


def test_the_command_line_evaluates_an_exported_model_on_a_local_task(model, tmp_path, capsys):
    """`rltok lm-eval` end to end: an exported folder, a task YAML over a local JSON file
    (`--include_path`), lm_eval's own results file; its perplexity and acc are the adapter's."""
    _lm_eval()
    import json

    from rltok.model.pretrained import save_pretrained

    from conftest import run_cli

    save_pretrained(model, tmp_path / "export")
    docs = [{"context": "The capital of France is", "continuation": " Paris."},
            {"context": "def f(x):\n    return", "continuation": " x * 2"}]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_gold.yaml").write_text(f"""task: local_gold
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "docs.jsonl"}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
  - metric: acc
metadata:
  version: 1.0
""")
    code, out, err = run_cli(capsys, "lm-eval", "--model_args", f"pretrained={tmp_path / 'export'}", "--tasks", "local_gold",
                             "--include_path", tmp_path / "tasks", "--batch_size", "2", "--device", "cpu",
                             "--output_path", tmp_path / "results")
    assert code == 0, err
    found = list((tmp_path / "results").rglob("results_*.json"))
    assert len(found) == 1, out + err
    got = json.loads(found[0].read_text())["results"]["local_gold"]
    # what the adapter scores directly: perplexity = exp(-mean log-likelihood of the continuations),
    # acc = the share greedy decoding would produce
    scored = RLTokLM(model=model, batch_size=1).loglikelihood([req(d["context"], d["continuation"]) for d in docs])
    assert got["perplexity,none"] == pytest.approx(math.exp(-sum(ll for ll, _ in scored) / len(docs)), rel=1e-5)
    assert got["acc,none"] == pytest.approx(sum(g for _, g in scored) / len(docs))
