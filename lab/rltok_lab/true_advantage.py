"""True advantage of a boundary: how much does closing a chunk at byte t change the loss?

For a batch of windows x (B, T), draw one segmentation b from the checkpoint's boundary rule
(as training does). At sampled free positions t (not 0, not the last), build the two
segmentations that equal b everywhere except b_t = 1 and b_t = 0, run the model with the
boundaries fixed, and sum the next-byte NLL (nats) over bytes t .. min(T-1, t + horizon):

    D_t = L(b_t = 0) - L(b_t = 1)        (> 0: a boundary at t helps)

Bytes before t cannot change (the model is causal in bytes and in boundary decisions); the
largest change seen there is reported as `causal_leak_max`, which should be ~0.

Positions are stratified by the class of byte x_t (the byte that would close the chunk):
indentation, whitespace, before_whitespace, after_whitespace, punctuation, mid_word, other.

The estimators' view: on the same sampled segmentation, each estimator gives a per-decision
advantage (B, T), the number training multiplies into log pi(b_t). For a window-1 Bernoulli
policy with p_t = P(b_t = 1), the true advantage of the action taken is

    A_true = (1 - pi(b_t)) (R(b_t) - R(1 - b_t)),  R = -L
           = (1 - p_t) D_t if b_t = 1,   -p_t D_t if b_t = 0,

and we report the Pearson correlation of each estimator's advantage with A_true. (For a policy
with window > 1 the other decisions are held fixed, so A_true leaves out how b_t changes the
later decisions' probabilities.)
"""

from __future__ import annotations

import dataclasses

import math
import string
from typing import Callable

import torch

from rltok.data.bytes_classes import ASCII_WHITESPACE
from rltok.config import ConfigError, ObjectiveConfig
from rltok.objective.loss import boundary_advantages, returns_of, token_nll
from rltok.objective.rewards import make_reward

CLASSES = ("indentation", "whitespace", "before_whitespace", "after_whitespace", "punctuation", "mid_word",
           "other")
# space, tab, LF, CR: vertical tab and form feed are too rare in text to be whitespace here
WHITESPACE = ASCII_WHITESPACE - frozenset(b"\x0b\x0c")
NEWLINES = frozenset(b"\n\r")
PUNCTUATION = frozenset(string.punctuation.encode())

# estimator(model, out, x, y, objective_cfg) -> (rows, T) per-decision advantage, where `out` is
# the model's output on the sampled segmentation of the rows x (targets y)
Estimator = Callable[..., torch.Tensor]


def reference_advantage(model, out, x: torch.Tensor, y: torch.Tensor, cfg: ObjectiveConfig) -> torch.Tensor:
    """The advantage training uses: the reward, then boundary_advantages (baseline over the
    whole batch, discounted return) with the checkpoint's objective config. A price per chunk,
    when the objective has one, is not included: D_t measures the loss alone."""
    # under another estimator, the score function's default returns (returns_of)
    settings = returns_of(cfg)
    if settings.batch_baseline and len(y) < 2:  # one row is its own baseline: an advantage of 0 everywhere
        raise ConfigError(f"the reference advantage's batch baseline needs at least 2 windows, got {len(y)}: "
                          "give more data or a larger --batch")
    reward = make_reward(cfg.reward.kind)(token_nll(out.early_logits, y), token_nll(out.logits, y))
    adv, _ = boundary_advantages(reward, out.boundaries.free, settings, out.values)
    return adv


ESTIMATORS: dict[str, Estimator] = {"reference": reference_advantage}


def _is_alnum(c: int) -> bool:
    return 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122


def byte_classes(data: bytes | list[int] | torch.Tensor) -> list[str]:
    """The class of every byte of one sequence (first matching rule wins, in CLASSES order):

    - indentation: a space/tab whose run of spaces and tabs starts right after a newline
    - whitespace: space, tab, newline, CR
    - before_whitespace: the next byte is whitespace
    - after_whitespace: the previous byte is whitespace
    - punctuation: ASCII punctuation
    - mid_word: an ASCII letter/digit between two ASCII letters/digits
    - other: the rest (bytes >= 0x80 among them)

    Bytes outside the sequence count as neither whitespace nor alphanumeric, and a run of
    spaces that reaches the start of the sequence is plain whitespace (its line start is unseen).
    """
    seq = data.tolist() if isinstance(data, torch.Tensor) else list(data)
    n = len(seq)
    out = []
    after_newline = False  # inside a run of spaces/tabs that follows a newline
    for t, c in enumerate(seq):
        prev = seq[t - 1] if t > 0 else None
        nxt = seq[t + 1] if t + 1 < n else None
        if c in WHITESPACE and c not in NEWLINES:
            after_newline = after_newline or (prev is not None and prev in NEWLINES)
        else:
            after_newline = False
        if after_newline:
            out.append("indentation")
        elif c in WHITESPACE:
            out.append("whitespace")
        elif nxt is not None and nxt in WHITESPACE:
            out.append("before_whitespace")
        elif prev is not None and prev in WHITESPACE:
            out.append("after_whitespace")
        elif c in PUNCTUATION:
            out.append("punctuation")
        elif _is_alnum(c) and prev is not None and nxt is not None and _is_alnum(prev) and _is_alnum(nxt):
            out.append("mid_word")
        else:
            out.append("other")
    return out


def _check_model(model) -> None:
    if not getattr(model, "hierarchical", False):
        raise ValueError("the true advantage needs the hierarchical (hourglass) model: boundaries must change it")
    if model.cfg.stages == 2:
        raise ValueError("two-stage models are not supported: flipping b_t changes the chunks the "
                         "supertoken decisions are made over")


@torch.no_grad()
def sample_segmentation(model, x: torch.Tensor, cfg: ObjectiveConfig, seed: int = 0):
    """Draw the segmentation the instrument studies, as training would: with objective
    group_size K, K segmentations per window (row i*K + k). -> (model output, row -> window index)."""
    k = cfg.group_size
    gen = torch.Generator(device=x.device).manual_seed(seed)
    out = model(x, mode="sample", generator=gen, **({"group_size": k} if k > 1 else {}))
    rows = torch.arange(len(x), device=x.device).repeat_interleave(k)
    return out, rows


def stratified_positions(classes: list[list[str]], candidates: torch.Tensor, n_per_class: int, seed: int = 0
                         ) -> tuple[dict[str, list[tuple[int, int]]], dict[str, int]]:
    """Up to n_per_class (row, t) per class among the candidate positions ((rows, T) bool),
    drawn without replacement by a seeded permutation. -> (chosen per class, candidates per class)."""
    by_class: dict[str, list[tuple[int, int]]] = {c: [] for c in CLASSES}
    for i, t in torch.nonzero(candidates.cpu()).tolist():
        by_class[classes[i][t]].append((i, t))
    gen = torch.Generator().manual_seed(seed)
    chosen = {}
    for c in CLASSES:
        pool = by_class[c]
        perm = torch.randperm(len(pool), generator=gen)[:n_per_class].tolist()
        chosen[c] = sorted(pool[j] for j in perm)
    return chosen, {c: len(v) for c, v in by_class.items()}


@torch.no_grad()
def variant_losses(model, x: torch.Tensor, y: torch.Tensor, b: torch.Tensor, positions: list[tuple[int, int]],
                   horizon: int | None = None, batch_size: int = 32
                   ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """For each (row, t): L over bytes t..min(T-1, t+horizon) with b_t = 1 and with b_t = 0 (the
    rest of row's b unchanged), batch_size variant rows per forward pass.
    -> (L1, L0) float64 tensors of len(positions), and the largest |NLL change| at bytes < t."""
    length = x.shape[1]
    per_pass = max(1, batch_size // 2)
    ar = torch.arange(length, device=x.device)
    l1, l0, leak = [], [], 0.0
    for s in range(0, len(positions), per_pass):
        chunk = positions[s : s + per_pass]
        ri = torch.tensor([i for i, _ in chunk], device=x.device).repeat_interleave(2)
        ts = torch.tensor([t for _, t in chunk], device=x.device).repeat_interleave(2)
        bv = b[ri].clone()
        rows = torch.arange(len(ri), device=x.device)
        bv[rows, ts] = rows % 2 == 0  # even rows: boundary at t, odd rows: none
        out = model.score(x[ri], bv)
        nll = token_nll(out.logits, y[ri]).double()
        end = length - 1 if horizon is None else ts + horizon
        window = (ar.unsqueeze(0) >= ts.unsqueeze(1)) & (ar.unsqueeze(0) <= torch.as_tensor(end).view(-1, 1))
        loss = (nll * window).sum(1)
        l1.append(loss[0::2])
        l0.append(loss[1::2])
        before = ar.unsqueeze(0) < ts[0::2].unsqueeze(1)
        diff = (nll[0::2] - nll[1::2]).abs() * before
        leak = max(leak, float(diff.max()) if diff.numel() else 0.0)
    empty = torch.zeros(0, dtype=torch.float64, device=x.device)
    return (torch.cat(l1) if l1 else empty), (torch.cat(l0) if l0 else empty), leak


def d_stats(d: list[float]) -> dict:
    """n, mean, standard error, share positive and mean magnitude of a list of D values."""
    n = len(d)
    if n == 0:
        return {"n": 0, "mean_D": None, "se_D": None, "share_positive": None, "mean_abs_D": None}
    mean = sum(d) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1) / n) if n > 1 else None
    return {"n": n, "mean_D": mean, "se_D": se, "share_positive": sum(v > 0 for v in d) / n,
            "mean_abs_D": sum(abs(v) for v in d) / n}


def pearson(a: list[float], b: list[float]) -> float | None:
    """Pearson correlation; None with fewer than 3 pairs or a constant side."""
    n = len(a)
    if n < 3:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    sab = sum((u - ma) * (v - mb) for u, v in zip(a, b))
    saa = sum((u - ma) ** 2 for u in a)
    sbb = sum((v - mb) ** 2 for v in b)
    if saa <= 0 or sbb <= 0:
        return None
    return sab / math.sqrt(saa * sbb)


def _corr(est: list[float], true: list[float]) -> dict:
    n = len(est)
    agree = [(u > 0) == (v > 0) for u, v in zip(est, true) if u != 0 and v != 0]
    return {"n": n, "pearson": pearson(est, true),
            "sign_agreement": sum(agree) / len(agree) if agree else None}


def _check_arguments(model, x: torch.Tensor, n_per_class: int, horizon: int | None, batch_size: int) -> None:
    _check_model(model)
    if horizon is not None and horizon < 0:
        raise ValueError("horizon must be >= 0 (or None: to the end of the window)")
    if n_per_class < 1 or batch_size < 1:
        raise ValueError("n_per_class and batch_size must be >= 1")
    if x.shape[1] < 3:
        raise ValueError("windows need at least 3 bytes to have a free position")


@dataclasses.dataclass
class _Measurement:
    """What the model gave on one sampled segmentation: the flipped positions' D and, for the rl
    chunker, the policy's probabilities and each estimator's advantages (all on the CPU)."""
    positions: list[tuple[int, int, str]]  # (row, t, class), class by class
    d: list[float]  # D_t of each position
    n_candidates: dict[str, int]
    n_cuts: dict[str, int]  # candidates of each class where the sampled segmentation cuts
    leak: float
    rows: int
    sampled_rate: float
    row_window: torch.Tensor  # row -> window index
    xr: torch.Tensor  # the rows' bytes
    b: torch.Tensor  # the sampled boundaries
    rl: bool  # a learned policy with logits: estimators and A_true apply
    p: torch.Tensor | None  # P(b_t = 1), rl only
    adv: dict[str, torch.Tensor]  # estimator name -> (rows, T) advantage, rl only


@torch.no_grad()
def _measure(model, x: torch.Tensor, y: torch.Tensor, objective_cfg: ObjectiveConfig, n_per_class: int,
             horizon: int | None, batch_size: int, seed: int, estimators: dict[str, Estimator] | None
             ) -> _Measurement:
    """Sample a segmentation, choose positions by class, and measure D_t and the estimators on it
    (in this order: the seeded draws are the segmentation, then the positions)."""
    out, row_window = sample_segmentation(model, x, objective_cfg, seed)
    xr, yr = x[row_window], y[row_window]
    bd = out.boundaries
    b = bd.b
    length = x.shape[1]
    ar = torch.arange(length, device=x.device)
    candidates = bd.free & (ar >= 1) & (ar <= length - 2)
    xr_cpu, row_window_cpu = xr.cpu(), row_window.cpu()
    classes = [byte_classes(row) for row in xr_cpu]
    chosen, n_candidates = stratified_positions(classes, candidates, n_per_class, seed)
    n_cuts = dict.fromkeys(CLASSES, 0)
    for i, t in torch.nonzero((candidates & b.bool()).cpu()).tolist():
        n_cuts[classes[i][t]] += 1
    positions = [(i, t, c) for c in CLASSES for i, t in chosen[c]]
    l1, l0, leak = variant_losses(model, xr, yr, b, [(i, t) for i, t, _ in positions], horizon, batch_size)
    d = (l0 - l1).cpu().tolist()

    rl = model.chunker.learned and bd.logits is not None
    ests = (ESTIMATORS if estimators is None else estimators) if rl else {}
    adv = {name: fn(model, out, xr, yr, objective_cfg).float().cpu() for name, fn in ests.items()}
    p = torch.sigmoid(bd.logits.float()).cpu() if rl else None
    return _Measurement(positions=positions, d=d, n_candidates=n_candidates, n_cuts=n_cuts, leak=leak, rows=len(xr),
                        sampled_rate=float(b.float().mean()),
                        row_window=row_window_cpu, xr=xr_cpu, b=b.cpu(), rl=rl, p=p, adv=adv)


def _position_records(m: _Measurement) -> list[dict]:
    """One record per flipped position; with a policy, its p, A_true and each estimator's advantage."""
    records = []
    for (i, t, c), dt in zip(m.positions, m.d):
        taken = bool(m.b[i, t])
        rec = {"row": i, "window": int(m.row_window[i]), "t": t, "class": c, "byte": int(m.xr[i, t]), "b": taken,
               "D": dt}
        if m.p is not None:
            pt = float(m.p[i, t])
            rec["p"] = pt
            rec["A_true"] = (1 - pt) * dt if taken else -pt * dt
            rec["advantages"] = {name: float(a[i, t]) for name, a in m.adv.items()}
        records.append(rec)
    return records


def _class_summary(records: list[dict], n_candidates: dict[str, int], n_cuts: dict[str, int],
                   with_p: bool) -> tuple[dict, dict]:
    """D's statistics per byte class and overall, and each class's cut rate over all of its
    candidates (not only the sampled positions). -> (per class, overall)."""
    total = sum(n_candidates.values())
    class_stats = {}
    for c in CLASSES:
        recs = [r for r in records if r["class"] == c]
        st = d_stats([r["D"] for r in recs])
        st["candidates"] = n_candidates[c]
        st["taken_rate"] = sum(r["b"] for r in recs) / len(recs) if recs else None
        st["cuts"] = n_cuts[c]
        st["cut_rate"] = n_cuts[c] / n_candidates[c] if n_candidates[c] else None
        if with_p:
            st["mean_p"] = sum(r["p"] for r in recs) / len(recs) if recs else None
        class_stats[c] = st
    overall = d_stats([r["D"] for r in records])
    overall["candidates"] = total
    # the sample is class-balanced; this reweights the class means by how common each class is
    weighted = [(n_candidates[c], class_stats[c]["mean_D"]) for c in CLASSES if class_stats[c]["n"]]
    wsum = sum(w for w, _ in weighted)
    overall["mean_D_population"] = sum(w * m for w, m in weighted) / wsum if wsum else None
    return class_stats, overall


def _estimator_correlations(records: list[dict], names) -> dict:
    """Each estimator's correlation with A_true, overall and per class."""
    est_stats = {}
    for name in names:
        e = {"overall": _corr([r["advantages"][name] for r in records], [r["A_true"] for r in records]),
             "classes": {}}
        for c in CLASSES:
            recs = [r for r in records if r["class"] == c]
            e["classes"][c] = _corr([r["advantages"][name] for r in recs], [r["A_true"] for r in recs])
        est_stats[name] = e
    return est_stats


def _settings(model, x: torch.Tensor, objective_cfg: ObjectiveConfig, m: _Measurement, n_per_class: int,
              horizon: int | None, batch_size: int, seed: int) -> dict:
    settings = {
        "n_per_class": n_per_class, "horizon": horizon, "batch_size": batch_size, "seed": seed,
        "windows": list(x.shape), "rows": m.rows, "group_size": objective_cfg.group_size,
        "chunker": model.cfg.chunker.kind, "policy_window": model.chunker.window if m.rl else None,
        "sampled_rate": m.sampled_rate, "causal_leak_max": m.leak, "classes": list(CLASSES),
        # what the reference advantage used: the reward and the score function's returns settings
        "objective": {"reward": objective_cfg.reward.kind, **dataclasses.asdict(returns_of(objective_cfg))},
    }
    if not m.rl:
        settings["note"] = "estimator correlations need the rl chunker"
    elif model.chunker.window > 1:
        settings["note"] = ("policy_window > 1: A_true holds the later decisions fixed, leaving out how b_t "
                            "changes their probabilities")
    return settings


def true_advantage(model, x: torch.Tensor, y: torch.Tensor, objective_cfg: ObjectiveConfig, n_per_class: int = 32,
                   horizon: int | None = None, batch_size: int = 32, seed: int = 0,
                   estimators: dict[str, Estimator] | None = None) -> dict:
    """The true advantage of a boundary per byte class, and how well each estimator tracks it.

    x, y: (B, T) windows and next-byte targets. `horizon`: bytes after t whose loss counts
    (None: to the end of the window). `batch_size`: variant rows per forward pass. `estimators`:
    name -> callable(model, out, x, y, objective_cfg) -> (rows, T) advantage (default ESTIMATORS,
    the reference estimator); used only for the rl chunker. Returns a JSON-serialisable dict:
    "classes" and "overall" (n, mean_D, se_D, share_positive, ...), "estimators" (Pearson
    correlation with A_true, overall and per class), "positions" (every sampled decision) and
    "settings".
    """
    _check_arguments(model, x, n_per_class, horizon, batch_size)
    was_training = model.training
    model.eval()
    try:
        m = _measure(model, x, y, objective_cfg, n_per_class, horizon, batch_size, seed, estimators)
    finally:
        model.train(was_training)
    records = _position_records(m)
    class_stats, overall = _class_summary(records, m.n_candidates, m.n_cuts, m.p is not None)
    return {"classes": class_stats, "overall": overall, "estimators": _estimator_correlations(records, m.adv),
            "positions": records, "settings": _settings(model, x, objective_cfg, m, n_per_class, horizon,
                                                        batch_size, seed)}


def _fmt(v, spec: str = ".4f") -> str:
    return "—" if v is None else format(v, spec)


def format_true_advantage(result: dict) -> str:
    """Markdown tables: D per byte class, then each estimator's correlation with A_true."""
    s = result["settings"]
    horizon = "end of window" if s["horizon"] is None else f"{s['horizon']} bytes"
    lines = [f"true advantage D_t = L(b_t=0) - L(b_t=1), nats over bytes t..t+horizon (horizon: {horizon}); "
             f"{s['rows']} rows x {s['windows'][1]} bytes, sampled rate {s['sampled_rate']:.3f}, "
             f"causal leak {s['causal_leak_max']:.2e}", "",
             "| class | candidates | cut rate | n | mean D | s.e. | share D > 0 | mean abs D | taken rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = list(result["classes"].items()) + [("overall", result["overall"])]
    for c, st in rows:
        taken = st.get("taken_rate")
        lines.append(f"| {c} | {st['candidates']} | {_fmt(st.get('cut_rate'), '.2f')} | {st['n']} "
                     f"| {_fmt(st['mean_D'])} | {_fmt(st['se_D'])} "
                     f"| {_fmt(st['share_positive'], '.2f')} | {_fmt(st['mean_abs_D'])} "
                     f"| {_fmt(taken, '.2f') if c != 'overall' else ''} |")
    pop = result["overall"].get("mean_D_population")
    if pop is not None:
        lines.append(f"\nmean D weighted by class frequency: {pop:.4f}")
    if result["estimators"]:
        names = list(result["estimators"])
        lines += ["", "Pearson correlation of each estimator's advantage with A_true (n pairs):", "",
                  "| class | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for c in list(CLASSES) + ["overall"]:
            cells = []
            for name in names:
                e = result["estimators"][name]
                r = e["overall"] if c == "overall" else e["classes"][c]
                cells.append(f"{_fmt(r['pearson'], '.3f')} (n={r['n']})")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if s.get("note"):
        lines.append(f"\nnote: {s['note']}")
    return "\n".join(lines)
