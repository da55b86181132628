"""lm-evaluation-harness adapter: any rltok model scored by `lm_eval` (0.4.x) over UTF-8 bytes, as the
model "rltok" (docs/DISTRIBUTED.md, "lm-evaluation-harness"). lm_eval is optional: without it this
module still imports, and RLTokLM's methods take plain tuples as well as lm_eval's Instances."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

import torch

try:  # optional: the harness is a heavy install (datasets, pandas, scikit-learn ...)
    from lm_eval.api.model import LM as _LMBase
    from lm_eval.api.registry import register_model as _register_model

    HAVE_LM_EVAL = True
except ImportError:  # pragma: no cover - exercised where lm_eval is absent
    _LMBase = object
    HAVE_LM_EVAL = False

    def _register_model(*_names):
        return lambda cls: cls

CONTEXT_OF_EMPTY = b"\n"  # what the first byte of a text is predicted from (as in generation)
LN2 = math.log(2.0)


def _args(req) -> tuple:
    return tuple(req.args) if hasattr(req, "args") else tuple(req)


def _utf8(s: str | bytes) -> bytes:
    return s if isinstance(s, (bytes, bytearray)) else s.encode("utf-8", errors="surrogateescape")


@_register_model("rltok")
class RLTokLM(_LMBase):
    """An rltok model behind lm_eval's LM interface (see the module docstring)."""

    def __init__(self, pretrained: Any = None, model: torch.nn.Module | None = None, device: str = "auto",
                 batch_size: int | str = 8, max_length: int | None = None, boundary_mode: str = "greedy",
                 seed: int = 0, dtype: str | None = None, max_gen_toks: int = 256, **_ignored):
        if HAVE_LM_EVAL:
            super().__init__()
        if (pretrained is None) == (model is None):
            raise ValueError("give pretrained=<folder, checkpoint or repo id> or model=<module>")
        from rltok.training.device import resolve_device

        device = str(device or "auto")
        if device.startswith("cuda") and not torch.cuda.is_available():
            # lm_eval's command line asks for cuda:0 unless told otherwise
            import warnings

            warnings.warn(f"device {device} requested but CUDA is not available; using the CPU", stacklevel=2)
            device = "cpu"
        self._dev = resolve_device(device)
        if model is None:  # a run folder, a checkpoint, a save_pretrained folder or a Hub repo id
            from rltok.training.loading import from_pretrained

            model = from_pretrained(str(pretrained), device=self._dev)
        self.model = model.to(self._dev).eval()
        self.amp = torch.bfloat16 if str(dtype) in ("bf16", "bfloat16") else None
        # batch_size "auto" (an lm_eval option) falls back to a fixed size: no memory probing here
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        mc = getattr(self.model, "model_config", None) or getattr(self.model, "cfg", None)
        self.max_length = int(max_length or (mc.max_seq_len if mc is not None else self.model.max_seq_len))
        if boundary_mode not in ("greedy", "sample"):
            raise ValueError("boundary_mode must be 'greedy' or 'sample'")
        self.boundary_mode = boundary_mode
        self.seed = int(seed)
        self.max_gen_toks = int(max_gen_toks)
        self.token_model = bool(getattr(self.model, "reads_tokens", False))  # the model says (any family)
        # right-padding a batch leaves earlier scores unchanged for causal byte models; a BPE rule
        # would tokenise the padding, so those models get batches of equal lengths only
        reads_ahead = getattr(getattr(self.model, "chunker", None), "noncausal", None) is not None
        self.pad_safe = not (self.token_model or reads_ahead)

    # lm_eval reads these
    @property
    def device(self):
        return self._dev

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def tokenizer_name(self) -> str:
        return "utf-8-bytes"

    # ---- scoring -------------------------------------------------------------------------------
    def _windows(self, n_prefix: int, n_total: int) -> list[tuple[int, int, int]]:
        """(input_start, first_target, end) windows covering targets n_prefix..n_total-1, each
        input at most max_length bytes and holding as much context as fits."""
        # a token model's input holds its targets and never scores its first token; a byte model's
        # input stops one byte short of its last target
        step = self.max_length - 1 if self.token_model else self.max_length
        out, a = [], n_prefix
        while a < n_total:
            b = min(a + step, n_total)
            out.append((max(0, b - step - 1), a, b))
            a = b
        return out

    @torch.no_grad()
    def _score(self, pairs: Sequence[tuple[bytes, bytes]]) -> list[tuple[float, bool, int]]:
        """(nats, greedy, bytes) of each continuation given its context."""
        jobs = []  # (pair index, window bytes, first scored offset, n scored)
        for i, (ctx, cont) in enumerate(pairs):
            full = (ctx or CONTEXT_OF_EMPTY) + cont
            n_prefix = len(full) - len(cont)
            for s, a, b in self._windows(n_prefix, len(full)):
                jobs.append((i, full[s:b], a - s, b - a))
        nats = [0.0] * len(pairs)
        greedy = [True] * len(pairs)
        # longest first, so padding is small; without pad_safe only equal lengths share a batch
        order = sorted(range(len(jobs)), key=lambda j: -len(jobs[j][1]))
        groups: list[list[int]] = []
        for j in order:
            if groups and len(groups[-1]) < self.batch_size and (
                    self.pad_safe or len(jobs[groups[-1][0]][1]) == len(jobs[j][1])):
                groups[-1].append(j)
            else:
                groups.append([j])
        gen = torch.Generator(device=self._dev).manual_seed(self.seed)
        for group in groups:
            for j, (n, g) in zip(group, self._score_batch([jobs[j] for j in group], gen)):
                nats[jobs[j][0]] += n
                greedy[jobs[j][0]] = greedy[jobs[j][0]] and g
        return [(nats[i], greedy[i], len(pairs[i][1])) for i in range(len(pairs))]

    def _score_batch(self, jobs, gen) -> list[tuple[float, bool]]:
        width = max(len(w) for _, w, _, _ in jobs)
        rows = [list(w) + [w[-1]] * (width - len(w)) for _, w, _, _ in jobs]  # padding: repeats of the last byte
        x = torch.tensor(rows, dtype=torch.long, device=self._dev)
        with torch.autocast(self._dev.type, dtype=self.amp, enabled=self.amp is not None):
            if self.token_model:  # nats of each token at its last byte, over the window itself
                out = self.model(x)
                per_byte = out.byte_nll.float()
                return [(float(per_byte[r, off:off + n].sum()), False) for r, (_, _, off, n) in enumerate(jobs)]
            # force_last=False: the last byte of a window is not made to close a chunk (as in
            # generation), which also makes a score independent of the padding after it
            out = self.model(x[:, :-1], mode=self.boundary_mode, generator=gen, force_last=False)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        results = []
        for r, (_, w, off, n) in enumerate(jobs):
            targets = x[r, off:off + n]
            lp = logp[r, off - 1:off - 1 + n]  # position t predicts byte t+1
            nat = -float(lp.gather(1, targets.unsqueeze(1)).sum())
            is_greedy = bool((lp[:, :256].argmax(-1) == targets).all())
            results.append((nat, is_greedy))
        return results

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [(_utf8(c), _utf8(t)) for c, t in (_args(r)[:2] for r in requests)]
        return [(-n, g) for n, g, _ in self._score(pairs)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs = [(b"", _utf8(_args(r)[0])) for r in requests]
        return [-n for n, _, _ in self._score(pairs)]

    def bpb(self, requests) -> float:
        """Bits per byte of the gold continuations of (context, continuation) requests: total
        nats / (total continuation bytes x ln 2)."""
        pairs = [(_utf8(c), _utf8(t)) for c, t in (_args(r)[:2] for r in requests)]
        scored = self._score(pairs)
        return sum(n for n, _, _ in scored) / max(1, sum(b for _, _, b in scored)) / LN2

    # ---- generation ----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from rltok.model.generate import generate

        if self.token_model:
            raise NotImplementedError(f"{type(self.model).__name__} reads tokens and does not generate; score it instead")
        out: list[str | None] = [None] * len(requests)
        batches: dict[tuple, list[int]] = defaultdict(list)
        parsed = []
        for i, r in enumerate(requests):
            args = _args(r)
            ctx, kw = args[0], dict(args[1] if len(args) > 1 and args[1] else {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            sample = bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 1.0)) if sample else 0.0
            top_k, top_p = int(kw.pop("top_k", 0) or 0), float(kw.pop("top_p", 1.0) or 1.0)
            parsed.append(_utf8(ctx))
            batches[(tuple(until), max_new, temperature, top_k, top_p)].append(i)
        for (until, max_new, temperature, top_k, top_p), idx in batches.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start:start + self.batch_size]
                gens = generate(self.model, [parsed[i] for i in chunk], max_new, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=self.seed, stop=[_utf8(u) for u in until],
                                mode=self.boundary_mode)
                for i, g in zip(chunk, gens):
                    out[i] = g.output.decode("utf-8", errors="replace")
        return out  # type: ignore[return-value]


# ---- in-memory tasks (no download) -------------------------------------------------------------
def _task(name: str, docs: list[dict], process_results, metrics, **fields) -> dict:
    """An lm_eval task config over `docs`; `metrics`: (name, aggregation, higher_is_better)."""

    def dataset(**_):
        import datasets

        return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})

    return {"task": name, "custom_dataset": dataset, "test_split": "test", "process_results": process_results,
            "metric_list": [{"metric": m, "aggregation": a, "higher_is_better": h} for m, a, h in metrics],
            "metadata": {"version": 1.0}, **fields}


def gold_bpb_task(docs: Iterable[dict], name: str = "rltok_gold_bpb") -> dict:
    """An lm_eval task config (pass it in `tasks=[...]`) scoring the gold `continuation` of each
    doc after its `context`: bits_per_byte over the continuations' bytes, and acc = share of
    continuations greedy decoding would produce. The text is joined without a delimiter."""

    def process_results(doc, results):
        ll, is_greedy = results[0]
        return {"bits_per_byte": (ll, len(_utf8(doc["continuation"]))), "acc": float(is_greedy)}

    return _task(name, list(docs), process_results, [("bits_per_byte", "bits_per_byte", False), ("acc", "mean", True)],
                 output_type="loglikelihood", doc_to_text=lambda d: d["context"],
                 doc_to_target=lambda d: d["continuation"], target_delimiter="")


def rolling_bpb_task(texts: Iterable[str], name: str = "rltok_rolling_bpb") -> dict:
    """A perplexity-style task over whole `texts` (like wikitext): bits_per_byte and byte_perplexity."""

    def process_results(doc, results):
        (ll,) = results
        n = len(_utf8(doc["text"]))
        return {"bits_per_byte": (ll, n), "byte_perplexity": (ll, n)}

    return _task(name, [{"text": t} for t in texts], process_results,
                 [("bits_per_byte", "bits_per_byte", False), ("byte_perplexity", "weighted_perplexity", False)],
                 output_type="loglikelihood_rolling", doc_to_text="", doc_to_target=lambda d: d["text"])


def main(argv: list[str] | None = None) -> int:
    """`rltok lm-eval ARGS`: lm_eval's own command line with the "rltok" model registered
    (`--model rltok` is the default)."""
    import sys

    if not HAVE_LM_EVAL:
        print("error: rltok lm-eval needs lm-evaluation-harness: pip install 'rltok[eval]'", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--model" or a.startswith("--model=") for a in argv):
        argv = ["--model", "rltok", *argv]
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:  # pragma: no cover
        from lm_eval._cli import cli_evaluate  # type: ignore
    old = sys.argv
    sys.argv = ["lm_eval", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = old
    return 0


__all__ = ["RLTokLM", "gold_bpb_task", "rolling_bpb_task", "HAVE_LM_EVAL"]
