"""Every boundary rule: causal decisions, a causal model, rates, gradients where promised."""

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config import CHUNKERS, FixedChunkerSettings, ObjectiveConfig
from rltok.model import HourglassLM
from rltok.model.chunkers import spacelike
from rltok.model.stage import ema_over_chunks
from rltok.objective.loss import compute_loss, token_nll

CAUSAL_RULES = ["rl", "fixed", "uniform", "whitespace", "entropy", "hnet", "gumbel", "dynamic_pooling"]


def text_batch(n=4, length=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(97, 123, (n, length), generator=g)  # letters...
    x[torch.rand(n, length, generator=g) < 0.18] = 32  # ...and spaces
    return x


@pytest.mark.parametrize("rule", CAUSAL_RULES)
def test_decisions_and_predictions_are_causal(rule):
    model = randomize_(HourglassLM(tiny_model_config(chunker=rule)), scale=0.2).eval()
    x = text_batch()
    ref = model(x, generator=torch.Generator().manual_seed(3), force_last=False)
    t = 20
    x2 = x.clone()
    x2[:, t + 1 :] = text_batch(seed=9)[:, t + 1 :]
    out = model(x2, generator=torch.Generator().manual_seed(3), force_last=False)
    if rule != "uniform":  # uniform ignores the bytes entirely: its draw is the same either way
        assert not torch.equal(x2, x)
    assert torch.equal(out.boundaries.b[:, : t + 1], ref.boundaries.b[:, : t + 1])
    assert torch.allclose(out.logits[:, : t + 1], ref.logits[:, : t + 1], atol=1e-5)


def test_uniform_places_exactly_rate_times_free_positions():
    model = HourglassLM(tiny_model_config(chunker="uniform", target_rate=0.25))
    x = text_batch(8, 66)
    b = model(x, generator=torch.Generator().manual_seed(0)).boundaries.b
    assert (b[:, 1:-1].sum(1) == round(0.25 * 64)).all()
    assert b[:, 0].all() and b[:, -1].all()
    assert not torch.equal(b[0], b[1])  # random positions, per sequence


def test_fixed_stride():
    model = HourglassLM(tiny_model_config(chunker=FixedChunkerSettings(stride=4)))
    b = model(text_batch(1, 20), force_last=False).boundaries.b[0]
    assert torch.nonzero(b).flatten().tolist() == [0, 3, 7, 11, 15, 19]


def test_whitespace_rule_ends_chunks_at_the_first_spacelike_byte():
    model = HourglassLM(tiny_model_config(chunker="whitespace"))
    text = b"ab cd, ef  g\xc3\xa9h"
    x = torch.tensor([list(text)])
    b = model(x, force_last=False).boundaries.b[0]
    ends = [text[: i + 1] for i in torch.nonzero(b).flatten().tolist()]
    # SpaceByte's rule: a UTF-8 lead byte is space-like (it ends the ASCII word before it),
    # continuation bytes are not
    assert ends == [b"a", b"ab ", b"ab cd,", b"ab cd, ef ", b"ab cd, ef  g\xc3"]
    assert not spacelike(torch.tensor([0xA9])) and spacelike(torch.tensor([0xC3]))


def test_entropy_rule_threshold_is_causal_hits_target_rate_and_is_kept_in_eval():
    model = randomize_(HourglassLM(tiny_model_config(chunker="entropy", target_rate=0.3)), scale=0.5)
    gen = torch.Generator().manual_seed(0)
    x1, x2 = torch.randint(0, 256, (8, 128), generator=gen), torch.randint(0, 256, (8, 128), generator=gen)
    model.train()
    # no threshold before the first training batch: no free boundary, then it learns one
    assert not model(x1).boundaries.b[:, 1:-1].any()
    assert not torch.isnan(model.chunker.threshold)
    # the next batch (same distribution) is cut with the threshold of the earlier one
    b2 = model(x2).boundaries.b
    assert abs(b2[:, 1:-1].float().mean().item() - 0.3) < 0.05
    # causal: a batch's cut does not depend on the batch's own future bytes
    state = {k: v.clone() for k, v in model.chunker.state_dict().items()}
    x3 = x2.clone()
    x3[:, 100:] = torch.randint(0, 256, (8, 28), generator=gen)
    model.chunker.load_state_dict(state)
    b_a = model(x2).boundaries.b
    model.chunker.load_state_dict(state)
    b_b = model(x3).boundaries.b
    assert torch.equal(b_a[:, :99], b_b[:, :99])
    thr = model.chunker.threshold.clone()
    model.eval()
    model(torch.randint(0, 256, (2, 64)))
    assert torch.equal(model.chunker.threshold, thr)  # evaluation never moves the threshold


@pytest.mark.parametrize("rule", ["hnet", "gumbel", "dynamic_pooling"])
def test_straight_through_rules_pass_lm_gradient_to_their_predictor(rule):
    model = randomize_(HourglassLM(tiny_model_config(chunker=rule)), scale=0.2)
    x = text_batch()
    out = model(x, generator=torch.Generator().manual_seed(0))
    token_nll(out.logits, x.roll(-1, 1)).mean().backward()  # LM loss only, no aux loss
    grads = [p.grad for p in model.chunker.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    assert out.boundaries.aux_loss is not None and out.boundaries.aux_loss.requires_grad


@pytest.mark.parametrize("rule", ["gumbel", "dynamic_pooling"])
def test_no_lm_gradient_reaches_the_scorer_at_a_forced_boundary(rule):
    """The first and last bytes always end a chunk: no decision of the scorer's, so no gradient."""
    model = randomize_(HourglassLM(tiny_model_config(chunker=rule)), scale=0.2)
    x = text_batch()
    kept = {}

    def keep(module, inputs, logits):  # returns None: the output stays as it is
        logits.retain_grad()
        kept.setdefault("logits", logits)

    model.chunker.mlp.register_forward_hook(keep)
    out = model(x, generator=torch.Generator().manual_seed(0), force_last=True)
    token_nll(out.logits, x.roll(-1, 1)).mean().backward()
    g = kept["logits"].grad.squeeze(-1)
    forced = ~out.boundaries.free
    assert forced[:, 0].all() and forced[:, -1].all()
    assert g[forced].abs().max() == 0 and g[~forced].abs().sum() > 0


@pytest.mark.parametrize("rule", ["hnet", "gumbel", "dynamic_pooling"])
def test_straight_through_rules_move_towards_target_rate(rule):
    torch.manual_seed(0)
    model = HourglassLM(tiny_model_config(chunker=CHUNKERS.settings(rule, **({"ratio_weight": 1.0} if rule == "hnet" else {})), target_rate=0.2))
    opt = torch.optim.Adam(model.chunker.parameters(), lr=1e-2)
    x = text_batch(8, 64)
    gen = torch.Generator().manual_seed(0)
    for _ in range(120):
        out = model(x, generator=gen)
        opt.zero_grad()
        out.boundaries.aux_loss.backward()
        opt.step()
    rate = model(x, generator=gen).boundaries.b[:, 1:-1].float().mean().item()
    assert abs(rate - 0.2) < 0.06, rate


def test_dynamic_pooling_chunks_are_normalised_means_of_their_bytes():
    """A chunk is the layer-normalised mean of its bytes' states, not its last byte's."""
    model = randomize_(HourglassLM(tiny_model_config(chunker="dynamic_pooling")), scale=0.2)
    rule = model.chunker
    h = torch.randn(2, 12, rule.norm.normalized_shape[0])
    b = torch.zeros(2, 12, dtype=torch.bool)
    b[0, [0, 3, 4, 11]] = True
    b[1, [0, 7]] = True  # a shorter row: its third slot is padding; bytes 8-11 close no chunk
    forced = torch.zeros_like(b)
    forced[:, 0] = True
    bd = rule(h, forced, b, generator=torch.Generator().manual_seed(0))
    last = torch.tensor([[0, 3, 4, 11], [0, 7, 0, 0]])
    z = rule.pool(h, bd, last)
    for row, spans in [(0, [(0, 1), (1, 4), (4, 5), (5, 12)]), (1, [(0, 1), (1, 8)])]:
        for j, (lo, hi) in enumerate(spans):
            assert torch.allclose(z[row, j], rule.norm(h[row, lo:hi].mean(0)), atol=1e-5)


def dense_segment_means(h, gate, forced_b, n):
    """The published downsample written as a dense membership matrix (n segments), for the parity
    test below: byte t belongs to segment s when the cuts strictly before t number s; its weight is
    1 + (that count - its value), so it carries the count's straight-through gradient; each
    segment is the weighted sum over bytes divided by the weights' sum."""
    gate = torch.where(forced_b, 1.0, gate)  # forced cuts: no gradient (they are not the rule's)
    before = torch.cumsum(gate, 1) - gate
    seg = torch.arange(n).view(1, 1, n)
    member = torch.where(seg == before.detach().round().unsqueeze(-1), 1 + before.unsqueeze(-1) - before.detach().unsqueeze(-1), 0.0)
    return torch.einsum("bts,btd->bsd", member, h) / member.sum(1).unsqueeze(-1).clamp(min=1e-9)


def test_dynamic_pooling_matches_the_published_downsample_in_value_and_gradient():
    """Against a dense re-derivation of the original's segment means: the same chunk vectors and
    the same gradient into the soft boundary sample (so the sign, which cuts feed which byte, and
    the mean's denominator are all pinned)."""
    torch.manual_seed(0)
    rule = HourglassLM(tiny_model_config(chunker="dynamic_pooling")).chunker
    rule.norm = torch.nn.Identity()  # compare the means themselves
    h = torch.randn(2, 24, 8)
    soft = torch.rand(2, 24, requires_grad=True)
    b = soft.detach() > 0.6
    b[1, 10:] = False  # a row with fewer chunks and an open tail
    forced = torch.zeros_like(b)
    forced[:, 0] = True
    b |= forced
    gate = soft + (b.float() - soft).detach()
    from rltok.model.chunkers import Boundaries
    from rltok.model.stage import boundary_positions
    bd = Boundaries(b=b, free=~forced, gate=gate)
    n_max = int(b.sum(1).max())
    ours = rule.pool(h, bd, boundary_positions(b, n_max))
    ref = dense_segment_means(h, gate, forced, n_max)
    real = torch.arange(n_max).unsqueeze(0) < b.sum(1, keepdim=True)
    assert torch.allclose(ours[real], ref[real], atol=1e-6)
    weights = torch.randn_like(ours)
    (g_ours,) = torch.autograd.grad((ours * weights)[real].sum(), soft)
    (g_ref,) = torch.autograd.grad((ref * weights)[real].sum(), soft)
    assert g_ref.abs().sum() > 0 and torch.allclose(g_ours, g_ref, atol=1e-5)


def test_dynamic_pooling_norm_trains_at_the_models_rate():
    """objective.policy_lr_mult scales the scorer only: the chunks' norm belongs to the model."""
    from rltok.training.trainer import make_optimizer
    from rltok.config import TrainConfig

    model = HourglassLM(tiny_model_config(chunker="dynamic_pooling"))
    opt = make_optimizer(model, TrainConfig(), torch.device("cpu"), policy_lr_mult=3.0)
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    assert all(scale[id(p)] == 3.0 for p in model.chunker.mlp.parameters())
    assert all(scale[id(p)] == 1.0 for p in model.chunker.norm.parameters())


def test_the_policy_rate_multiple_reaches_every_stages_learned_rule():
    from rltok.config import TrainConfig, load_config
    from rltok.model.factory import build_model
    from rltok.model.chunkers.policy import learned_rules
    from rltok.training.trainer import make_optimizer

    model = build_model(load_config("test", overrides=["model.stages=2", "objective.rate=penalty"]).model)
    rules = learned_rules(model)
    assert len(rules) == 2  # the byte level's and the supertokens'
    opt = make_optimizer(model, TrainConfig(), torch.device("cpu"), policy_lr_mult=10.0)
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    for name, rule in rules:
        assert all(scale[id(p)] == 10.0 for p in rule.policy_parameters()), name
    assert sum(s == 1.0 for s in scale.values()) > sum(s == 10.0 for s in scale.values())  # the rest at 1x


def test_dynamic_pooling_passes_the_lm_gradient_inside_chunks_where_gumbel_passes_it_at_cuts():
    """Why `gumbel` could not learn on this backbone and dynamic pooling can: with chunks pooled
    as means, the language model's loss reaches the scorer at bytes inside a chunk, not only at
    its cuts."""
    x = text_batch()
    reached = {}
    for rule in ("gumbel", "dynamic_pooling"):
        model = randomize_(HourglassLM(tiny_model_config(chunker=rule)), scale=0.2)
        logits = []

        def keep(module, inputs, output):
            output.retain_grad()
            logits.append(output)

        model.chunker.mlp.register_forward_hook(keep)
        out = model(x, generator=torch.Generator().manual_seed(0))
        token_nll(out.logits, x.roll(-1, 1)).mean().backward()
        grad = logits[0].grad.squeeze(-1)
        inside = out.boundaries.free & ~out.boundaries.b
        reached[rule] = (grad[inside].abs().mean().item(), grad[out.boundaries.b & out.boundaries.free].abs().mean().item())
    assert reached["gumbel"][0] == 0 and reached["gumbel"][1] > 0
    assert reached["dynamic_pooling"][0] > 0


def test_ema_over_chunks_matches_recurrence():
    z, p = torch.randn(2, 30, 5), torch.rand(2, 30)
    p[:, 0] = 1.0
    prev, ref = torch.zeros(2, 5), []
    for j in range(30):
        prev = p[:, j, None] * z[:, j] + (1 - p[:, j, None]) * prev
        ref.append(prev)
    assert torch.allclose(ema_over_chunks(z, p), torch.stack(ref, 1), atol=1e-4)


@pytest.mark.parametrize("rule", CAUSAL_RULES)
def test_every_rule_trains_one_step(rule):
    model = HourglassLM(tiny_model_config(chunker=rule))
    x = text_batch()
    out = model(x, generator=torch.Generator().manual_seed(0))
    loss, metrics = compute_loss(out, x.roll(-1, 1), ObjectiveConfig(), 0.2)
    loss.backward()
    # the entropy rule has no threshold before its first training batch (it is causal)
    assert torch.isfinite(loss) and (0 < metrics["rate"] < 1 or (rule == "entropy" and metrics["rate"] == 0))


def test_bpe_rule_uses_the_tokenizer_token_ends_and_travels_in_checkpoints(tmp_path):
    from rltok.data.bpe import bpe_boundary_mask, encode_bytes
    from rltok.training.checkpoint import save_checkpoint
    from rltok.training.loading import load_checkpoint
    from rltok.config import Config
    from rltok.data.sources import read_documents

    docs, _ = read_documents("stdlib", max_bytes=300_000)
    model = HourglassLM(tiny_model_config(chunker="bpe", target_rate=0.3))
    fit = model.chunker.fit(b"".join(docs))
    text = b"def forward(self, x):\n    return self.head(x)  # caf\xc3\xa9 \xff\n"
    x = torch.tensor([list(text)])
    b = model(x, force_last=False).boundaries.b
    assert torch.equal(b[0, 1:], bpe_boundary_mask(fit.tokenizer, x)[0, 1:])
    assert bpe_boundary_mask(fit.tokenizer, x).sum() == len(encode_bytes(fit.tokenizer, text))
    cfg = Config()
    cfg.model = model.cfg
    cfg.train.seq_len = 64
    save_checkpoint(tmp_path, 1, model, cfg)
    loaded, *_ = load_checkpoint(tmp_path)
    assert torch.equal(loaded(x, force_last=False).boundaries.b, b)


def test_every_rule_is_importable_from_the_package_and_lives_in_its_kinds_module():
    import importlib

    import rltok.model.chunkers as package

    homes = {"rl": "policy", "fixed": "fixed", "uniform": "fixed", "whitespace": "fixed", "entropy": "fixed",
             "hnet": "straight_through", "gumbel": "straight_through",
             "dynamic_pooling": "straight_through", "bpe": "bpe"}
    for kind, module in homes.items():
        cls = CHUNKERS.component(kind)
        assert cls.__module__ == f"rltok.model.chunkers.{module}", kind
        assert getattr(package, cls.__name__) is cls
    for name in package.__all__:
        owner = getattr(package, name).__module__
        assert getattr(importlib.import_module(owner), name) is getattr(package, name)


@pytest.mark.parametrize("window", [2, 3, 8])
@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("shape", [(8, 512), (3, 17), (2, 1), (1, 64)])
def test_window_sampler_scan_equals_position_by_position(window, greedy, shape):
    from rltok.model.chunkers.policy import RLPolicy
    policy = RLPolicy(16, window=window)
    g = torch.Generator().manual_seed(window * 1000 + shape[1])
    with torch.no_grad():
        policy.history.weight.normal_(0.0, 2.0, generator=g)  # histories that move decisions
    base = 2 * torch.randn(shape, generator=g)
    forced = torch.rand(shape, generator=g) < 0.05
    u = torch.rand(shape, generator=g)
    if greedy:
        policy.cut_at = 0.3  # a settled rule's cut, not 0
    drawn = None if greedy else u
    scan = policy._sample_scan(base, forced, drawn, greedy)
    sequential = policy._sample_sequential(base, forced, drawn, greedy)
    assert torch.equal(scan[0], sequential[0]) and torch.equal(scan[1], sequential[1])
    assert scan[0][forced].all()
    if base.numel() >= 64:  # both decisions occur, so the histories differ along the row
        assert 0 < scan[0].float().mean() < 1
    # sample() takes the scan at these sizes and the position-by-position path past SCAN_LIMIT
    assert torch.equal(policy.sample(base, forced, greedy, None, drawn)[1], sequential[1])


def test_window_sampler_falls_back_past_the_scan_limit(monkeypatch):
    from rltok.model.chunkers import policy as policy_module
    policy = policy_module.RLPolicy(8, window=4)
    empty = policy.sample(torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool), False, None, torch.rand(2, 0))
    assert empty[0].shape == empty[1].shape == (2, 0)
    calls = []
    monkeypatch.setattr(policy_module.RLPolicy, "_sample_sequential",
                        lambda self, *a: calls.append("sequential") or (torch.zeros(1), torch.zeros(1)))
    monkeypatch.setattr(policy_module, "SCAN_LIMIT", 10)
    policy.sample(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool), False, None, torch.rand(2, 4))
    assert calls == ["sequential"]
