"""Cached generation: parity with the parallel pass, batching, sampling controls, CLI, heat maps."""

import io

import pytest
import torch
from conftest import randomize_, tiny_model_config

from rltok import cli
from rltok.checkpoint import save_checkpoint
from rltok.config import Config
from rltok.generate import HourglassState, Utf8Streamer, _pending, make_state, sample_bytes, slide_start
from rltok.model import FlatByteLM, HourglassLM

CHUNKERS = [dict(chunker="rl", policy_window=1), dict(chunker="rl", policy_window=4),
            dict(chunker="fixed", fixed_stride=3)]
IDS = ["rl-w1", "rl-w4", "fixed"]


@pytest.fixture(autouse=True)
def _one_thread(_threads):
    """Decoding steps are tiny: a second thread only adds contention on a shared machine."""
    torch.set_num_threads(1)


def make_model(**kw) -> HourglassLM:
    base = dict(encoder_layers=2, main_layers=2, decoder_layers=2, window=8, max_seq_len=64)
    base.update(kw)
    model = randomize_(HourglassLM(tiny_model_config(**base)))
    if base.get("chunker", "rl") == "rl":  # a policy that actually varies, centred near rate 0.3
        with torch.no_grad():
            model.chunker.head.bias.fill_(-0.8)
    return model.eval()


def incremental(model, x: torch.Tensor, b: torch.Tensor | None, prefill: int):
    """Logits for positions prefill-1 .. T-1 of x (T,): `prefill` bytes read in parallel, then one per step."""
    st = HourglassState(model, 1, 64, generator=torch.Generator().manual_seed(1))
    logits, bd, blog = st.prefill(0, x[:prefill], None if b is None else b[:prefill])
    outs, bs, blogs = [logits], [bd], [blog]
    for t in range(prefill, len(x)):
        logits, bt, bl = st.step(x[t:t + 1], None if b is None else b[t:t + 1])
        outs.append(logits[0])
        bs.append(bt)
        blogs.append(bl)
    blogs = None if blogs[0] is None else torch.cat(blogs)
    return torch.stack(outs), torch.cat(bs), blogs


@pytest.mark.parametrize("kw", CHUNKERS, ids=IDS)
@pytest.mark.parametrize("prefill", [1, 13])
def test_incremental_logits_equal_parallel_forward(kw, prefill):
    model = make_model(**kw)
    x = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x.unsqueeze(0), mode="sample", generator=torch.Generator().manual_seed(2), force_last=False)
    b = ref.boundaries.b[0]
    assert 6 <= int(b.sum()) <= 30  # several chunk boundaries, and 40 bytes > window 8
    logits, b_inc, blogits = incremental(model, x, b, prefill)
    assert torch.equal(b_inc, b)
    assert (logits - ref.logits[0, prefill - 1:]).abs().max() <= 1e-4
    if kw["chunker"] == "rl":  # the policy sees the same history as teacher forcing
        assert (blogits - ref.boundaries.logits[0]).abs().max() <= 1e-4


@pytest.mark.parametrize("kw", CHUNKERS, ids=IDS)
def test_boundaries_sampled_during_decoding_are_the_ones_used(kw):
    model = make_model(**kw)
    x = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3))
    logits, b, _ = incremental(model, x, None, prefill=4)
    assert b[0] and 6 <= int(b.sum()) <= 30
    with torch.no_grad():
        ref = model(x.unsqueeze(0), boundaries=b.unsqueeze(0), force_last=False)
    assert (logits - ref.logits[0, 3:]).abs().max() <= 1e-4


@pytest.mark.parametrize("window", [None, 8])
def test_flat_model_cache_matches_parallel(window):
    model = randomize_(FlatByteLM(32, 2, 2, window=window, max_seq_len=64)).eval()
    x = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(0))
    st = make_state(model, 1, 64)
    outs = [st.prefill(0, x[:5])[0]]
    for t in range(5, 30):
        outs.append(st.step(x[t:t + 1])[0][0])
    with torch.no_grad():
        ref = model(x.unsqueeze(0)).logits[0]
    assert (torch.stack(outs) - ref[4:]).abs().max() <= 1e-4


@pytest.mark.parametrize("kw", CHUNKERS, ids=IDS)
def test_batched_equals_unbatched(kw):
    model = make_model(**kw)
    g = torch.Generator().manual_seed(5)
    lengths, steps = [3, 17, 30], 20
    seqs = [torch.randint(0, 256, (n + steps,), generator=g) for n in lengths]
    bounds = [torch.rand(n + steps, generator=g) < 0.3 for n in lengths]
    batched = HourglassState(model, 3, 64)
    first = [batched.prefill(i, s[:n], b[:n])[0] for i, (s, b, n) in enumerate(zip(seqs, bounds, lengths))]
    rows = [[f] for f in first]
    for k in range(steps):
        ids = torch.stack([s[n + k] for s, n in zip(seqs, lengths)])
        given = torch.stack([b[n + k] for b, n in zip(bounds, lengths)])
        logits, _, _ = batched.step(ids, given)
        for i in range(3):
            rows[i].append(logits[i])
    for i, (s, b, n) in enumerate(zip(seqs, bounds, lengths)):
        single = HourglassState(model, 1, 64)
        ref = [single.prefill(0, s[:n], b[:n])[0]]
        for t in range(n, n + steps):
            ref.append(single.step(s[t:t + 1], b[t:t + 1])[0][0])
        assert (torch.stack(rows[i]) - torch.stack(ref)).abs().max() <= 1e-4


def test_batched_generation_equals_unbatched_greedy():
    model = make_model()
    prompts = [b"a", b"hello there", b"x" * 25]
    kw = dict(temperature=0, mode="greedy")
    batched = model.generate(prompts, 30, **kw)
    for p, gen in zip(prompts, batched):
        assert gen.output == model.generate(p, 30, **kw).output


def test_greedy_output_is_argmax_of_parallel_pass_with_kept_boundaries():
    model = make_model(policy_window=4)
    g = model.generate(b"some prompt", 30, temperature=0, seed=0)
    data = g.prompt + g.output
    assert len(g.boundaries) == len(data) - 1  # the last byte is never read
    x = torch.tensor(list(data[:-1])).unsqueeze(0)
    with torch.no_grad():
        out = model(x, boundaries=torch.tensor(g.boundaries).unsqueeze(0), force_last=False)
    assert out.logits[0, len(g.prompt) - 1:, :256].argmax(-1).tolist() == list(g.output)


def test_context_slides_at_max_seq_len():
    model = make_model(max_seq_len=32)
    g = model.generate(b"p" * 40, 70, seed=0)  # overlong prompt and several slides
    assert g.prompt == b"p" * 32 and len(g.output) == 70 and len(g.boundaries) == 32 + 69


def spy_prefills(monkeypatch) -> list:
    """Record every HourglassState.prefill: (start, ids, given boundaries, boundaries used)."""
    calls, real = [], HourglassState.prefill

    def spy(self, row, ids, boundaries=None, **kw):
        out = real(self, row, ids, boundaries, **kw)
        calls.append((kw.get("start", 0), ids.clone(), None if boundaries is None else boundaries.clone(),
                      out[1].clone()))
        return out

    monkeypatch.setattr(HourglassState, "prefill", spy)
    return calls


@pytest.mark.parametrize("kw", CHUNKERS, ids=IDS)
def test_sliding_keeps_every_boundary_decision(kw, monkeypatch):
    """A slide re-reads the newer part of the context with the decisions already made: no
    boundary is forced at the new first byte, and every prediction after a slide is what the
    parallel pass gives on that window with the recorded boundaries."""
    model = make_model(max_seq_len=32, **kw)
    calls = spy_prefills(monkeypatch)
    g = model.generate(b"the prompt, ", 90, temperature=0, seed=0)  # boundaries sampled, rate ~0.3
    data = g.prompt + g.output
    slides = [c for c in calls if c[2] is not None]
    assert len(slides) >= 3
    for k, (start, ids, given, used) in enumerate(slides):
        assert 0 < start and len(ids) <= 31 and bytes(ids.tolist()) == data[start:start + len(ids)]
        later = {s for s, _, _, _ in slides[k + 1:]}  # a later slide may have to force its first byte
        assert all(given[i] == g.boundaries[start + i] for i in range(len(ids)) if start + i not in later)
        assert torch.equal(used, given.bool()) and bool(given[0])  # nothing forced, nothing changed
    if kw["chunker"] == "fixed":  # the stride keeps its phase across slides
        assert g.boundaries == [i == 0 or (i + 1) % 3 == 0 for i in range(len(g.boundaries))]
    ends = [s + len(ids) for s, ids, _, _ in slides[1:]] + [len(g.boundaries)]
    for (start, ids, _, _), stop in zip(slides, ends):
        x = torch.tensor(list(data[start:stop])).unsqueeze(0)
        with torch.no_grad():
            out = model(x, boundaries=torch.tensor(g.boundaries[start:stop]).unsqueeze(0), force_last=False)
        first = start + len(ids)  # the first byte the window's steps read
        assert out.logits[0, first - start:, :256].argmax(-1).tolist() == list(data[first + 1:stop + 1])


def test_slide_forces_a_boundary_only_when_none_is_in_reach(monkeypatch):
    assert slide_start([True] + [False] * 39, 40, 32) == (24, True)  # byte 0 is out of reach
    assert slide_start([False] * 20 + [True] + [False] * 19, 40, 32) == (20, False)  # nearest, older
    assert slide_start([False] * 9 + [True] + [False] * 14 + [False] * 15 + [True], 40, 32) == (39, False)
    assert slide_start([False] * 22 + [True, False, False, True] + [False] * 14, 40, 32) == (25, False)
    model = make_model(max_seq_len=32)
    with torch.no_grad():
        model.chunker.head.bias.fill_(-100.0)  # a policy that never closes a chunk itself
    calls = spy_prefills(monkeypatch)
    g = model.generate(b"x", 80, temperature=0, mode="greedy", seed=0)
    slides = [c for c in calls if c[2] is not None]
    assert slides and all(torch.equal(used, given.bool()) for _, _, given, used in slides)
    assert [i for i, b in enumerate(g.boundaries) if b] == [0] + [s for s, _, _, _ in slides]


def test_sampling_controls():
    logits = torch.randn(4, 264, generator=torch.Generator().manual_seed(0))
    logits[:, 256:] = 100.0  # specials must never come out, however likely
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_bytes(logits, top_k=1, generator=g), logits[:, :256].argmax(-1))
    assert torch.equal(sample_bytes(logits, top_p=1e-6, generator=g), logits[:, :256].argmax(-1))
    draws = torch.stack([sample_bytes(logits, temperature=2.0, top_k=5, top_p=0.9, generator=g) for _ in range(50)])
    assert int(draws.max()) < 256
    top5 = logits[:, :256].topk(5).indices
    assert all(set(draws[:, r].tolist()) <= set(top5[r].tolist()) for r in range(4))

    model = make_model()
    a = model.generate(b"abc", 40, seed=7)
    assert a.output == model.generate(b"abc", 40, seed=7).output
    assert a.output != model.generate(b"abc", 40, seed=8).output
    # boundaries are still sampled at temperature 0: the seed fixes them
    assert model.generate(b"abc", 25, top_k=1, seed=3).output == model.generate(b"abc", 25, temperature=0,
                                                                                seed=3).output
    assert len(a.output) == 40 and a.stop_reason == "max_bytes"
    assert model.generate(b"abc", 0).output == b""


def test_stop_strings_and_streaming():
    model = make_model()
    full = model.generate(b"abc", 60, temperature=0, seed=0).output
    stop = full[20:23]
    streamed = []
    g = model.generate(b"abc", 60, temperature=0, seed=0, stop=[stop, b"\x00never"],
                       on_bytes=lambda row, d: streamed.append(d))
    assert g.output == full[: full.find(stop)] and g.stop_reason == "stop"
    assert b"".join(streamed) == g.output
    assert _pending(bytearray(b"abc\n"), [b"\n\n"]) == 1 and _pending(bytearray(b"abc"), [b"\n"]) == 0


def test_utf8_streamer_holds_incomplete_characters():
    buf = io.StringIO()
    s = Utf8Streamer(buf)
    data = "é€😀".encode()
    seen = []
    for i in range(len(data)):
        s.write(data[i:i + 1])
        seen.append(buf.getvalue())
    assert seen == ["", "é", "é", "é", "é€", "é€", "é€", "é€", "é€😀"]
    s.write(b"\xffok\xe2")
    s.close()
    assert buf.getvalue() == "é€😀\\xffok\\xe2"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    run = tmp_path_factory.mktemp("gen_run")
    cfg = Config()
    cfg.model = tiny_model_config(max_seq_len=64)
    cfg.train.seq_len = 32
    save_checkpoint(run, 1, HourglassLM(cfg.model), cfg.validate())
    return str(run)


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_cli_generate_bad_input(ckpt, capsys, tmp_path):
    rc, out, err = run_cli(capsys, "generate", "-c", ckpt, "", "-n", "10")
    assert rc == 0 and "newline" in err and len(out) > 0
    rc, out, err = run_cli(capsys, "generate", "-c", ckpt, "y" * 100, "-n", "10")
    assert rc == 0 and "keeping the last 64" in err
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\xff\xfe\xc3(")
    rc, out, err = run_cli(capsys, "generate", "-c", ckpt, "-f", str(bad), "-n", "10", "--echo")
    assert rc == 0 and out.startswith("\\xff\\xfe\\xc3(")
    for argv in (["x", "--top-p", "0"], ["x", "-n", "-1"], ["-f", str(tmp_path / "missing")], ["x", "-f", str(bad)]):
        rc, _, err = run_cli(capsys, "generate", "-c", ckpt, *argv)
        assert rc == 2 and err.startswith("error:")
    rc, out, _ = run_cli(capsys, "generate", "-c", ckpt, "x", "-n", "50", "--stop", "\\x00", "--top-k", "3",
                         "-t", "0.8", "--top-p", "0.9")
    assert rc == 0


def test_segment_heat_maps(ckpt, capsys, tmp_path):
    html, png = tmp_path / "b.html", tmp_path / "b.png"
    argv = ["segment", "-c", ckpt, "def f(x):\n    return x  # ünïcode \xff", "--html", str(html)]
    if pytest.importorskip("matplotlib"):
        argv += ["--png", str(png)]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0 and "wrote" in err
    text = html.read_text()
    assert text.count("<span") >= 30 and 'class="b"' in text and "ü" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
