"""Compute-matched comparison of boundary rules: every method trained to the same training FLOPs
spent, one JSON per run, resumable (docs/CONFIG.md, "Commands")."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import statistics
import threading
import subprocess
import time
from pathlib import Path

from rltok.analysis.table_cells import table
from rltok.config import CHUNKERS, FAMILIES, Config, ConfigError, load_config
from rltok.model.flops import run_cost, train_flops_per_byte

_REF = ["model.chunker=rl", "objective.recipe=reference"]

# method -> config overrides on top of the base config; any other registered boundary rule or
# model family (a plugin's too) is a method by its own name (method_base)
METHODS: dict[str, list[str]] = {
    "rl": ["model.chunker=rl"],  # the preset's recipe (small: the lexicon recipe)
    "rl_reference": _REF,  # the published recipe
    "hnet": ["model.chunker=hnet"],
    "gumbel": ["model.chunker=gumbel"],
    "entropy": ["model.chunker=entropy"],
    "whitespace": ["model.chunker=whitespace"],
    "bpe": ["model.chunker=bpe"],
    "bpe_line": ["model.chunker=bpe", "model.bpe_pretokenize=line"],  # superword BPE, reaches 0.2
    "fixed": ["model.chunker=fixed"],
    "uniform": ["model.chunker=uniform"],
    "flat": ["model.arch=flat"],
    "bpe_token": ["model.arch=bpe_token"],
    # the reference's ablations and the variance reducers (all: the rl rule, published recipe)
    "rl_gamma1": [*_REF, "objective.estimator.gamma=1.0"],
    "rl_no_batch": [*_REF, "objective.estimator.baseline=none"],
    "rl_final_reward": [*_REF, "objective.reward=final"],
    "rl_w8": [*_REF, "model.chunker.window=8"],
    "rl_no_rate": [*_REF, "objective.rate.weight=0"],
    "rl_group4": [*_REF, "objective.estimator.baseline=group", "objective.group_size=4"],
    "rl_value": [*_REF, "objective.estimator.baseline=batch+value"],
    "rl_group4_value": [*_REF, "objective.estimator.baseline=group+value", "objective.group_size=4"],
}

# pieces a byte model can add to any method (`rl+ngram+cvocab`): a vocabulary's memory at no
# matrix-product cost. The sizes give the small preset roughly the BPE-token model's parameters.
PIECES: dict[str, list[str]] = {
    "ngram": ["model.ngram_vocab=32768"],  # hashed byte 3..6-grams, 32768 rows per n
    "cvocab": ["model.chunk_vocab=32768"],  # hashed chunk contents, 32768 rows
}


@functools.cache
def git_commit() -> str:
    """HEAD's short hash ("+dirty" when tracked files under src/ differ from it), read on the first
    call and kept: a sweep that calls it first records the code it runs, wherever HEAD moves."""
    root = Path(__file__).resolve().parents[3]  # the repository (src/rltok/analysis/compare.py)
    try:
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                       stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=root,
                               stderr=subprocess.DEVNULL).returncode == 1
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hierarchy_forward_flops(cfg: Config) -> float:
    """Forward FLOPs per byte of the hierarchical model of `cfg`'s shape at its target rate (an
    hourglass whatever model.arch says: what the references are matched to)."""
    hourglass = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, arch="hourglass"))
    return run_cost(hourglass).forward()["total"]


def matched_flat_layers(cfg: Config) -> int:
    """Depth at which the flat byte model (width d_chunk) costs what the hourglass costs per byte."""
    # one full-attention layer without n-gram tables: the per-layer cost the depth is counted in
    one_layer = dataclasses.replace(cfg.model, arch="flat", flat_layers=1, flat_window=0, ngram_vocab=0)
    per_layer = run_cost(dataclasses.replace(cfg, model=one_layer)).forward()["total"]
    head = 2.0 * cfg.model.d_chunk * 264
    return max(1, round((hierarchy_forward_flops(cfg) - head) / (per_layer - head)))


def reference_budget(ref: Config, budget_bytes: int) -> float:
    """The training FLOPs of `budget_bytes` bytes of the hierarchical model `ref` at its target rate."""
    return budget_bytes * train_flops_per_byte({"total": hierarchy_forward_flops(ref)})


BUDGET_TOLERANCE = 0.02  # a run whose spend misses the budget by more is flagged


class PeakMemory:
    """Peak memory while training: the CUDA allocator's peak on a GPU; on a CPU the largest
    resident set size sampled every 20 ms (the process's, so it includes the data and Python)."""
    peak_mb: float | None = None
    kind = "cpu_rss"

    @staticmethod
    def _rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    def _sample(self):
        while not self._done.wait(0.02):
            self.peak_mb = max(self.peak_mb or 0.0, self._rss_mb())

    def __enter__(self):
        import torch

        if torch.cuda.is_available():
            self.kind = "cuda_allocated"
            torch.cuda.reset_peak_memory_stats()
        elif os.path.exists("/proc/self/statm"):
            self._done = threading.Event()
            self.peak_mb = self._rss_mb()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            self.kind = "unavailable"
        return self

    def __exit__(self, *_):
        if self.kind == "cuda_allocated":
            import torch

            self.peak_mb = torch.cuda.max_memory_allocated() / 2 ** 20
        elif self.kind == "cpu_rss":
            self._done.set()
            self._thread.join()
            self.peak_mb = max(self.peak_mb, self._rss_mb())
        return False


def vocab_cell(r: dict) -> str:
    """The vocabulary column: `BPE <size>` for the BPE-token model, `<n-gram rows> / <chunk-vocab
    rows>` for byte models (0 where off), – for runs recorded before these fields existed."""
    if r.get("bpe_vocab") is not None:
        return f"BPE {r['bpe_vocab']}"
    if r.get("ngram_rows") is None and r.get("chunk_vocab_rows") is None:
        return "–"
    return f"{r.get('ngram_rows') or 0} / {r.get('chunk_vocab_rows') or 0}"


def probe_rate(model, corpus, cfg: Config) -> float | None:
    """The rate to plan the schedule with: the target for rules that track it, else the chunks per
    byte `model` draws on the start of the training split (BPE, whitespace, the BPE-token model)."""
    import torch

    from rltok.data.windows import eval_windows

    rule = getattr(model, "chunker", None)
    if rule is not None and rule.tracks_target:
        return cfg.model.target_rate
    device = next(model.parameters()).device
    x, _ = eval_windows(corpus.train[:400_000], cfg.train.seq_len, 16)
    return model.chunks_per_byte(x.to(device), generator=torch.Generator(device=device).manual_seed(0))


def training_rate(history: list[dict], key: str = "rate", last: int = 3) -> float | None:
    """The mean of `key` over the last logged training records (what the rule drew in training)."""
    vals = [r[key] for r in history if key in r][-last:]
    return sum(vals) / len(vals) if vals else None


def method_base(name: str) -> list[str]:
    """The overrides of a method NAME: its entry in METHODS, else the boundary rule (CHUNKERS) or
    the model family (FAMILIES) registered under that name."""
    if name in METHODS:
        return METHODS[name]
    if name in CHUNKERS:
        return [f"model.chunker={name}"]
    if name in FAMILIES:
        return [f"model.arch={name}"]
    raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)} or any boundary rule or model "
                     "family registered (optionally NAME+PIECE...@key=value,...)")


def method_overrides(method: str) -> list[str]:
    """A method's config overrides. `NAME+PIECE+...@key=value,key=value` is method NAME with the
    PIECES named and extra overrides, e.g. `rl+ngram`, `rl@model.target_rate=0.3` or
    `whitespace+ngram+cvocab@model.chunk_vocab=65536`."""
    spec, _, extra = method.partition("@")
    name, *pieces = spec.split("+")
    base = method_base(name)
    for piece in pieces:
        if piece not in PIECES:
            raise ValueError(f"unknown piece {piece!r} in {method!r}; choose from {', '.join(PIECES)}")
    return [*base, *(o for piece in pieces for o in PIECES[piece]), *(e for e in extra.split(",") if e)]


def method_slug(method: str) -> str:
    """A file name for a method: `rl@objective.rate.compute_price=0.1` -> `rl__objective.rate.compute_price-0.1`."""
    return method.replace("@", "__").replace("+", "-").replace("=", "-").replace(",", "_").replace("/", "_")


def method_config(method: str, base: list[str], data: str, out_dir: Path, seed: int, preset: str) -> Config:
    named = method_base(method.partition("@")[0].partition("+")[0])
    extra = method_overrides(method)
    # the base with the method's rule or family: base keys may set that rule's own settings
    flat = not FAMILIES.component(load_config(preset, overrides=[*base, *named]).model.arch).hierarchical
    if flat:  # a reference at the hierarchy's parameters: matched depth first, so NAME@model.flat_layers=... wins
        hierarchy = load_config(preset, overrides=[*base, f"data.train={data}"])
        extra.insert(len(named), f"model.flat_layers={matched_flat_layers(hierarchy)}")
    return load_config(preset, overrides=[*base, f"data.train={data}", *extra, f"train.seed={seed}",
                                          f"train.out_dir={out_dir}"])


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """A budget run as planned before its trainer is built: from its model's cost at the rate it
    is expected to draw, the steps the budget buys, and the config that runs them."""
    rate: float | None  # chunks (tokens) per byte planned with (probe_rate)
    train_flops_per_byte: float  # training FLOPs per distinct byte at that rate
    bytes_per_step: int  # distinct training bytes per step
    steps: int
    config: Config  # the run's config with the budget, the step cap, the warm-up and the cadence set


def plan_budget(cfg: Config, costed, corpus, budget_flops: float, warmup_at: float | None = None) -> BudgetPlan:
    """Plan a run of `cfg` to `budget_flops` from `costed` (rltok.training.build.costed_model) and
    `corpus`. `warmup_at`: run_one's."""
    # distinct bytes: with group_size K, batch_size counts segmentations of batch_size / K sequences
    k = cfg.objective.group_size if FAMILIES.component(cfg.model.arch).hierarchical else 1
    bytes_per_step = cfg.train.batch_size // k * cfg.train.grad_accum * cfg.train.seq_len
    rate = probe_rate(costed.model, corpus, cfg)
    fpb = train_flops_per_byte({"total": costed.cost.forward_per_byte(rate)})
    steps = max(1, round(budget_flops / (fpb * bytes_per_step)))
    tc = cfg.train
    # a share of the planned steps (train.warmup_frac), else the preset's, at most a tenth of the run
    # (the steps warmup_at plans, when given); under "wsd" a warm-up in steps stays as given: one
    # that followed the budget would keep a larger budget from branching from this run
    warm = steps if warmup_at is None else max(1, round(warmup_at / (fpb * bytes_per_step)))
    warmup = tc.warmup_steps
    if tc.warmup_frac or not tc.constant_phase:
        warmup = tc.warmup_for(warm) if tc.warmup_frac else min(tc.warmup_steps, max(1, warm // 10))
    # every method stops on the FLOPs it spends (and the LR follows the share spent); the step
    # cap only guards against a rule that spends far less than planned
    planned = dataclasses.replace(
        tc, eval_every=max(1, steps // 6), checkpoint_every=max(1, steps // 3), flops_budget=budget_flops,
        max_steps=4 * steps, warmup_steps=warmup)
    return BudgetPlan(rate, fpb, bytes_per_step, steps, dataclasses.replace(cfg, train=planned))


@dataclasses.dataclass
class _Trained:
    """A finished training run and what it was planned and measured at."""
    trainer: object
    memory: PeakMemory
    plan: BudgetPlan
    wall: float  # seconds, building the model included


def _train_to_budget(cfg: Config, budget_flops: float, warmup_at: float | None = None,
                     branch: Path | None = None) -> _Trained:
    """Train (or resume) one method until it has spent budget_flops (`warmup_at`, `branch`: run_one's);
    a stop request ends the sweep."""
    import torch

    from rltok.training import run_folder
    from rltok.training.build import costed_model, load_data
    from rltok.training.checkpoint import list_checkpoints
    from rltok.training.device import resolve_device
    from rltok.training.fits import refuse_what_cannot_fit
    from rltok.training.trainer import Trainer

    refuse_what_cannot_fit(cfg, resolve_device(cfg.train.device))  # as `train` does, before data or model
    t0 = time.time()
    memory = PeakMemory()
    # a branch starts the run folder at its checkpoint, unless the folder holds checkpoints already
    # (an interrupted branch resumes)
    seeded = branch is not None and not list_checkpoints(cfg.train.out_dir)
    if seeded:
        run_folder.seed_from_branch(cfg.train.out_dir, branch)
    if cfg.train.threads > 0:  # as the trainer sets them, before anything is built
        torch.set_num_threads(cfg.train.threads)
    corpus = load_data(cfg)
    costed = costed_model(cfg, corpus)  # BPE: fits its tokenizer
    costed.model.to(resolve_device(cfg.train.device))  # the rate is probed where training runs
    plan = plan_budget(cfg, costed, corpus, budget_flops, warmup_at)
    trainer = Trainer(plan.config, corpus=corpus, resume=True, quiet=True, costed=costed)
    if branch is not None:  # refused when its run would not end where one from scratch ends: the folder as it was
        try:
            run_folder.check_branch(branch, trainer.cfg)
        except Exception:
            trainer.lock.release()
            if seeded:
                run_folder.unseed(trainer.run_dir, branch)
            raise
    with memory:
        trainer.fit()
    if trainer.stop_requested:  # SIGINT/SIGTERM: the run is checkpointed; stop the whole sweep
        raise KeyboardInterrupt
    return _Trained(trainer, memory, plan, time.time() - t0)


def _run_record(method: str, seed: int, data: str, eval_split: str, budget_flops: float, t: _Trained,
                max_eval_windows: int, context: int) -> dict:
    """The JSON record of one run: what was trained, at what cost, and how its final checkpoint
    evaluates on the held-out split, with the rule it trained with and thresholded where it samples."""
    import torch

    from rltok.harness.run_eval import evaluate_run

    trainer = t.trainer
    run = evaluate_run(Path(trainer.cfg.train.out_dir), data, eval_split, seq_len=trainer.cfg.train.seq_len,
                       max_windows=max_eval_windows, context=context, batch_size=16, seed=0, code_metrics=False,
                       greedy=True)
    model, ev, greedy = run.model, run.result, run.greedy
    records = trainer.history
    steps = trainer.step
    train_bytes = steps * t.plan.bytes_per_step
    spent = trainer.flops_spent
    supertokens = training_rate(records, "supertokens_per_chunk")
    bps = [r["bytes_per_s"] for r in records[1:]] or [r["bytes_per_s"] for r in records]
    eval_rate = ev.get("chunks_per_byte") or training_rate(records, "chunks_per_byte")
    curve = [{"step": r["step"], "bytes": r["bytes"], "train_flops": r["train_flops"], "val_bpb": r["val_bpb"],
              "val_rate": r.get("val_rate")} for r in records if "val_bpb" in r]
    return {
        "method": method, "seed": seed, "data": data, "split": eval_split, "commit": git_commit(),
        **model.shape_facts(),  # depth, width, bpe_vocab, ngram_rows, chunk_vocab_rows
        # weights, gradients and AdamW's two moments in fp32: what the parameters cost in memory
        "params": model.num_params(), "state_mb": 4 * 4 * sum(p.numel() for p in model.parameters()) / 2 ** 20,
        "peak_mem_mb": t.memory.peak_mb,
        "peak_mem_kind": t.memory.kind, "steps": steps, "train_bytes": train_bytes,
        # the training-split bytes a BPE tokenizer was fitted on (model.bpe_sample_bytes), besides
        # the ones trained on; None for models without one
        "tokenizer_fit_bytes": model.fit_facts().get("tokenizer_fit_bytes"),
        "planned_rate": t.plan.rate, "planned_train_flops_per_byte": t.plan.train_flops_per_byte,
        "budget_flops": budget_flops, "train_flops": spent, "budget_ratio": spent / budget_flops,
        "budget_flag": abs(spent / budget_flops - 1) > BUDGET_TOLERANCE,
        "train_flops_per_byte": spent / max(1, train_bytes),
        # the BPE-token model reports no chunks in evaluation: its tokens per byte as trained.
        # Attention counted both ways (rltok.model.flops): the causal pairs, which the budget is
        # charged with, and what the kernel computes (masked pairs and padding included)
        "attention_count": "causal",
        "forward_flops_per_byte": trainer.cost.forward_per_byte(eval_rate, supertokens),
        "forward_flops_per_byte_kernel": trainer.cost.forward_per_byte(eval_rate, supertokens, attention="kernel"),
        "train_rate": training_rate(records), "train_chunks_per_byte": training_rate(records, "chunks_per_byte"),
        "rate2": training_rate(records, "rate2"), "supertokens_per_chunk": supertokens,
        "bpb": ev["bpb"], "eval_context": context, "eval_bytes": ev["bytes"], "rate": ev.get("rate"), "chunks_per_byte": ev.get("chunks_per_byte"),
        "bytes_per_chunk": ev.get("bytes_per_chunk"),
        "space_align": ev.get("space_align"), "space_end": ev.get("space_end"),
        "chunk_length_hist": ev.get("chunk_length_hist"),
        "bpb_greedy": greedy["bpb"] if greedy else None, "rate_greedy": greedy.get("rate") if greedy else None,
        "space_align_greedy": greedy.get("space_align") if greedy else None,
        "train_bytes_per_s": statistics.median(bps) if bps else None, "wall_s": t.wall,
        "threads": torch.get_num_threads(), "curve": curve, "config": run.config.to_dict(),
        # what bit-level results depend on: two records agree to the last bit only where these match
        "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def run_one(method: str, seed: int, data: str, run_root: Path, budget_flops: float, base: list[str],
            preset: str = "tiny", eval_split: str = "test", max_eval_windows: int = 0, eval_context: int = 1,
            branch_from: Path | None = None, warmup_at: float | None = None) -> dict:
    """Train one method with one seed to the FLOPs budget, evaluate it, and return its record.
    `branch_from`: a "wsd" branch checkpoint (or its run folder) at a smaller budget to go on from
    (docs/CONFIG.md, "The learning-rate schedule"); its record adds `branch_checkpoint` and
    `own_flops`. `warmup_at`: the budget whose planned steps train.warmup_frac is a share of."""
    from rltok.training import run_folder
    from rltok.training.checkpoint import read_trainer_state

    out_dir = run_root / f"{method_slug(method)}_s{seed}"
    cfg = method_config(method, base, data, out_dir, seed, preset)
    branch = None if branch_from is None else run_folder.branch_checkpoint(branch_from)
    trained = _train_to_budget(cfg, budget_flops, warmup_at, branch)
    rec = _run_record(method, seed, data, eval_split, budget_flops, trained, max_eval_windows, eval_context)
    if branch is not None:
        spent = read_trainer_state(branch)["objective"]["flops_spent"]
        rec.update(branch_checkpoint=str(branch), own_flops=rec["train_flops"] - spent)
    return rec


def _refuse_other_sweep(done: dict, path: Path, cfg, **asked) -> None:
    """A finished record is reused only by the sweep that made it: same data, split, budget,
    evaluation context, and the same model and objective settings (preset and overrides)."""
    differ = [f"{k} ({done.get(k)!r} -> {v!r})" for k, v in asked.items() if done.get(k) != v]
    now = json.loads(json.dumps(cfg.to_dict()))  # as the record holds it (tuples as lists)
    for section in ("model", "objective"):
        was = (done.get("config") or {}).get(section)
        differ += [f"{section}.{k} ({was.get(k)!r} -> {v!r})" for k, v in now[section].items()
                   if was is not None and k in was and was[k] != v]
    if differ:
        raise ConfigError(f"{path} was made by another sweep: {', '.join(differ[:6])}"
                          f"{' ...' if len(differ) > 6 else ''}; give another --out, or move the folder aside")


def run_sweep(data: str, methods: list[str], seeds: list[int], out: Path, budget_flops: float,
              base: list[str], preset: str = "tiny", eval_split: str = "test", max_eval_windows: int = 0,
              log=print, eval_context: int = 1) -> list[dict]:
    from rltok.config.files import read_record, write_atomic

    git_commit()  # the commit the sweep starts from, before any run can take long
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in seeds:
        for method in methods:
            path = out / f"{method_slug(method)}_s{seed}.json"
            done = read_record(path, "result", hint="running it again") if path.exists() else None
            if done is not None:
                _refuse_other_sweep(done, path, method_config(method, base, data, out / "runs" / path.stem, seed, preset),
                                    data=data, split=eval_split, budget_flops=budget_flops, eval_context=eval_context)
                results.append(done)
                log(f"{method} seed {seed}: done already")
                continue
            log(f"{method} seed {seed}: training ...")
            res = run_one(method, seed, data, out / "runs", budget_flops, base, preset, eval_split, max_eval_windows,
                          eval_context)
            write_atomic(path, json.dumps(res, indent=2))  # complete or absent, power loss or not
            log(f"{method} seed {seed}: bpb {res['bpb']:.4f} rate {res['rate'] or float('nan'):.3f} "
                f"({res['wall_s']:.0f} s)")
            results.append(res)
    return results


def mean_sd(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _by_method(results: list[dict]) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["method"], []).append(r)
    return by


def reads_ahead(record: dict) -> bool:
    """Whether a run's boundary rule decides a cut at byte t from bytes after t (its chunker says
    why it cannot generate, `Chunker.noncausal`, e.g. BPE-guided cuts): its bpb has seen part of
    the future. Read from the record's config, so records of any age answer."""
    model = (record.get("config") or {}).get("model") or {}
    chunker = model.get("chunker")
    kind = chunker.get("kind") if isinstance(chunker, dict) else chunker
    arch = model.get("arch", "hourglass")
    if not isinstance(kind, str) or kind not in CHUNKERS or not isinstance(arch, str) or arch not in FAMILIES:
        return False  # a family or rule of a plugin not loaded here cannot say
    if not FAMILIES.component(arch).hierarchical:
        return False
    return getattr(CHUNKERS.entries[kind].component(), "noncausal", None) is not None


def summarize(results: list[dict]) -> list[dict]:
    rows = []
    for method, rs in _by_method(results).items():
        ratios = [r["train_flops"] / r["budget_flops"] for r in rs if r.get("budget_flops")]
        bpb = [r["bpb"] for r in rs]

        def cell(key: str, digits: int = 3) -> str:
            return mean_sd([r.get(key) for r in rs], digits)

        def mean(key: str) -> float:
            return statistics.mean(r[key] for r in rs)

        rows.append({
            "method": method, "seeds": len(rs), "bpb_mean": statistics.mean(bpb),
            "bpb_std": statistics.stdev(bpb) if len(rs) > 1 else None, "bpb": mean_sd(bpb, 4),
            "bpb_by_seed": {r["seed"]: r["bpb"] for r in rs},  # for differences paired by seed
            "bpb_greedy": cell("bpb_greedy", 4), "rate": cell("rate"), "train_rate": cell("train_rate"),
            "rate_greedy": cell("rate_greedy"), "bytes_per_chunk": cell("bytes_per_chunk", 2),
            "space_align": cell("space_align"), "train_flops_per_byte": mean("train_flops_per_byte"),
            "train_flops": mean("train_flops"), "budget_ratio_min": min(ratios) if ratios else None,
            "budget_ratio_max": max(ratios) if ratios else None,
            "budget_flag": any(abs(x - 1) > BUDGET_TOLERANCE for x in ratios) or len(ratios) < len(rs),
            "train_bytes": mean("train_bytes"),
            "train_bytes_per_s": statistics.mean(r["train_bytes_per_s"] or 0 for r in rs),
            "depth": rs[0].get("depth"), "width": rs[0].get("width"), "vocab": vocab_cell(rs[0]),
            "params": rs[0]["params"], "state_mb": rs[0].get("state_mb"),
            "peak_mem_mb": max((r.get("peak_mem_mb") or 0.0) for r in rs) or None,
            "reads_ahead": any(map(reads_ahead, rs)),
        })
    rows.sort(key=lambda r: r["bpb_mean"])
    return rows


def markdown_table(rows: list[dict], split: str = "test") -> str:
    """One row per method; `spend/budget` is the spent FLOPs' range over seeds, flagged (!) beyond
    the tolerance."""
    lines = []
    for r in rows:
        ahead = " †" if r.get("reads_ahead") else ""
        if r["budget_ratio_min"] is None:
            spend = "– (!)"
        else:
            lo, hi = r["budget_ratio_min"], r["budget_ratio_max"]
            spend = f"{lo:.3f}" if abs(hi - lo) < 5e-4 else f"{lo:.3f}–{hi:.3f}"
            spend += " (!)" if r["budget_flag"] else ""
        depth, width, state, peak = (r.get(k) for k in ("depth", "width", "state_mb", "peak_mem_mb"))
        lines.append(f"| {r['method']}{ahead} | {r['seeds']} | {r['bpb']} | {r['rate']} | {r['train_rate']} "
                     f"| {r['bytes_per_chunk']} | {r['space_align']} | {r['bpb_greedy']} | {r['rate_greedy']} "
                     f"| {r['train_flops_per_byte'] / 1e6:.2f}M | {r['train_flops']:.3e} | {spend} "
                     f"| {r['train_bytes'] / 1e6:.2f}M | {r['train_bytes_per_s'] / 1e3:.1f}k "
                     f"| {'–' if depth is None else depth} | {'–' if width is None else width} "
                     f"| {r.get('vocab') or '–'} | {r['params'] / 1e6:.2f}M "
                     f"| {'–' if state is None else f'{state:.0f}'} | {'–' if peak is None else f'{peak:.0f}'} |")
    return table(["method", "seeds", f"{split} bpb", "rate (eval)", "rate (train)", "bytes/chunk", "space align",
                  "greedy bpb", "greedy rate", "train FLOPs/byte", "train FLOPs", "spend/budget", "train bytes",
                  "train bytes/s", "depth", "width", "vocab", "params", "state MB", "peak mem MB"], lines) + (
        "\n\n† its cuts read bytes after the one predicted (the rule cannot generate): its bpb is not a "
        "causal model's." if any(r.get("reads_ahead") for r in rows) else "")


def plot(results: list[dict], out: Path, title: str) -> list[Path]:
    """Every seed's validation curve against training FLOPs, per method; and the chunk lengths of
    the methods whose records have them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name: str) -> Path:
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        return out / name

    by_method = _by_method(results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    token_level = False
    for i, (method, rs) in enumerate(sorted(by_method.items())):
        # the BPE-token model's training-time validation scores the bytes of its windows' whole
        # tokens, not the same bytes as the byte models (the final, evaluated numbers do)
        arch = ((rs[0].get("config") or {}).get("model") or {}).get("arch")
        tokens = arch in FAMILIES and getattr(FAMILIES.component(arch), "score_window", None) is not None
        token_level |= tokens
        for j, r in enumerate(sorted(rs, key=lambda r: r["seed"])):  # every seed's whole curve
            ax.plot([c["train_flops"] for c in r["curve"]], [c["val_bpb"] for c in r["curve"]], marker="o", ms=3,
                    color=f"C{i % 10}", alpha=0.9 if j == 0 else 0.45,
                    label=(f"{method} *" if tokens else method) if j == 0 else None, ls="-" if i < 10 else "--")
    if token_level:
        fig.text(0.01, 0.01, "* scored on its own windows' whole tokens while training: not the byte models' bytes",
                 fontsize=7)
    ax.set(xlabel="training FLOPs", ylabel="validation bpb", xscale="log", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths = [save(fig, "bpb_vs_flops.png")]
    hier = [m for m in sorted(by_method) if by_method[m][0].get("chunk_length_hist")]
    if hier:
        fig, axes = plt.subplots(1, len(hier), figsize=(2.2 * len(hier), 2.6), sharey=True)
        axes = [axes] if len(hier) == 1 else axes
        for ax, method in zip(axes, hier):
            hist = by_method[method][0]["chunk_length_hist"]
            ax.bar(range(1, len(hist[:24]) + 1), [h / max(1, sum(hist)) for h in hist[:24]])
            ax.set_title(method, fontsize=9)
            ax.set_xlabel("chunk length (bytes)", fontsize=7)
        axes[0].set_ylabel("share of chunks")
        paths.append(save(fig, "chunk_lengths.png"))
    return paths


def write_report(results: list[dict], out: Path, title: str, command: str) -> Path:
    from rltok.config.files import write_atomic

    rows = summarize(results)
    write_atomic(out / "summary.json", json.dumps({"command": command, "commit": git_commit(), "rows": rows}, indent=2))
    plots = plot(results, out, title)
    split = results[0].get("split", "test") if results else "test"
    md = [f"## {title}", "", f"Command: `{command}`  ", f"Commit: `{git_commit()}`", "", markdown_table(rows, split), ""]
    md += [f"![{p.stem}]({p.name})" for p in plots]
    path = out / "README.md"
    path.write_text("\n".join(md) + "\n")
    return path
