"""The vocabulary a trained chunker has learned: which byte strings its chunks are, how often
they occur, how they sit against word boundaries, and how they compare with a BPE tokenizer
fitted to the same rate on the same corpus (`rltok vocab`).

Everything is bytes: a chunk is a `bytes` slice of the text, so invalid UTF-8 needs no special
case; only display goes through `segment.show`.
"""

from __future__ import annotations

import random
import time
import warnings
from collections import Counter

import numpy as np
import torch

from rltok.data.bytes_classes import ASCII_WHITESPACE
from rltok.config import ConfigError
from rltok.data.sources import DataError, named_split
from rltok.data.corpus import load_corpus, load_eval_bytes
from rltok.model.segment import show, split_chunks

HIST_MAX = 32  # chunk length histogram: lengths 1..31, the last bin is 32 or more
COVERAGE_AT = (1_000, 10_000)


# ---- segmenting a corpus -------------------------------------------------------------------------

def _windows(n: int, seq_len: int, context: int) -> list[tuple[int, int, int]]:
    """(start, length, keep_from) of overlapping windows covering n bytes. Window k starts at
    k * step (step = seq_len - context) and contributes its bytes from `keep_from` on: all of the
    first window, and after the first `context` bytes for the others, so every decision that is
    kept (except near the start of the text) was made with at least `context` bytes of history,
    and the forced boundary at each window's first byte never reaches the result."""
    step = seq_len - context
    out, start = [], 0
    while True:
        out.append((start, min(seq_len, n - start), 0 if start == 0 else context))
        if start + seq_len >= n:
            return out
        start += step


@torch.no_grad()
def learned_boundaries(model, data: bytes, seq_len: int, mode: str = "sample", seed: int = 0,
                       device: str | torch.device = "cpu", batch_size: int = 16,
                       context: int | None = None) -> torch.Tensor:
    """(len(data),) bool: byte t closes a chunk, from the model's own chunker run over windows
    of `seq_len` bytes (the length it was trained on) in batches. Windows overlap by `context`
    bytes (default seq_len // 4) so that window edges leave no artefacts: a boundary decision
    depends on the bytes before it, which a cut would hide. Works for every boundary rule; only
    `out.boundaries.b` of the model output is read (other fields are ignored)."""
    n = len(data)
    if n == 0:
        return torch.zeros(0, dtype=torch.bool)
    seq_len = max(1, min(seq_len, model.cfg.max_seq_len))
    context = seq_len // 4 if context is None else max(0, min(context, seq_len - 1))
    stride = getattr(getattr(model, "chunker", None), "stride", None)
    if stride is not None:
        # a fixed stride counts from each window's start: keep the step a multiple of it, or the
        # seams would cut chunks of other lengths
        step = (seq_len - context) // stride * stride
        context = seq_len - step if step else 0
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    b = torch.zeros(n, dtype=torch.bool)
    wins = _windows(n, seq_len, context)
    full = [w for w in wins if w[1] == seq_len]
    rest = [w for w in wins if w[1] != seq_len]  # at most one short window, at the end

    def run(group: list[tuple[int, int, int]]) -> None:
        length = group[0][1]
        starts = torch.tensor([s for s, _, _ in group])
        x = flat[starts.unsqueeze(1) + torch.arange(length)].long().to(device)
        out = model(x, mode=mode, generator=gen, force_last=False)
        bd = getattr(out, "boundaries", None)
        if bd is None:
            raise ConfigError(f"{type(model).__name__} reports no boundaries: nothing to build a vocabulary from")
        rows = bd.b.cpu()
        for row, (s, ln, keep) in zip(rows, group):
            b[s + keep : s + ln] = row[keep:ln]

    try:
        for i in range(0, len(full), batch_size):
            run(full[i : i + batch_size])
        if rest:
            run(rest)
    finally:
        model.train(was_training)
    return b


def bpe_chunks(tok, data: bytes) -> list[bytes]:
    """The tokens of `data` under a byte-exact BPE (rltok.data.bpe), as byte strings."""
    from rltok.data.bpe import encode_bytes, token_lengths

    if not data:
        return []
    ends = np.cumsum(token_lengths(tok)[encode_bytes(tok, data)])
    if len(ends) == 0 or ends[-1] != len(data):
        raise RuntimeError("BPE tokens do not cover the text byte for byte")
    starts = np.concatenate([[0], ends[:-1]])
    return [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]


def learned_chunks(model, data: bytes, seq_len: int, mode: str = "sample", seed: int = 0,
                   device: str | torch.device = "cpu", batch_size: int = 16,
                   context: int | None = None) -> list[bytes]:
    """`data` cut into the model's chunks. A BPE-token LM (no chunker, a tokenizer) gives its
    tokens over the whole text; a flat byte model has no chunks and is refused."""
    if hasattr(model, "chunker"):
        return split_chunks(data, learned_boundaries(model, data, seq_len, mode, seed, device, batch_size, context))
    if getattr(model, "tokenizer", None) is not None:
        return bpe_chunks(model.tokenizer, data)
    raise ConfigError(f"{type(model).__name__} has no chunker (a flat byte model): it has no vocabulary to show")


# ---- statistics ----------------------------------------------------------------------------------

def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None  # None (JSON null): undefined, e.g. no chunks at all


def chunk_stats(chunks: list[bytes], top: int = 30) -> dict:
    """Statistics of a segmentation; `chunks` are consecutive pieces of one text, in order.

    Whitespace means ASCII whitespace (space, \\t, \\n, \\r, \\v, \\f) and a word is a maximal run
    of other bytes (so "foo." or "x=1" is one word).

    - rate: chunks per byte; bytes_per_chunk: its inverse.
    - length_hist: counts of chunk lengths 1, 2, ..., 31 and, last, 32 or more (32 entries).
    - multi_word: share of chunks that, after stripping leading and trailing whitespace, still
      contain whitespace, i.e. hold parts of two or more words ("a b", " of the").
    - whole_word: share of chunks that hold exactly one complete word plus any surrounding
      whitespace: the stripped chunk is non-empty with no whitespace inside, and the word is
      complete on both sides - it starts at a word start (the chunk begins with whitespace, or
      the previous chunk ends with whitespace, or it is the first chunk) and ends at a word end
      (the chunk ends with whitespace, or the next chunk begins with whitespace, or it is the
      last chunk). " the", "the " and "the" between spaces count; "ing " and "the" in "thesis" do not.
    - whitespace_only: share of chunks made of whitespace alone.
    - top: the `top` most frequent chunks (display string, count, share of all occurrences).
    - coverage_top_1k / _10k: share of occurrences taken by the 1k / 10k most frequent distinct chunks.
    """
    n = len(chunks)
    n_bytes = sum(map(len, chunks))
    counts = Counter(chunks)
    hist = [0] * HIST_MAX
    multi = whole = ws_only = 0
    for i, c in enumerate(chunks):
        hist[min(len(c), HIST_MAX) - 1] += 1
        words = c.split()  # bytes.split(): runs of non-ASCII-whitespace bytes
        if not words:
            ws_only += 1
        elif len(words) > 1:
            multi += 1
        else:
            starts = c[0] in ASCII_WHITESPACE or i == 0 or chunks[i - 1][-1] in ASCII_WHITESPACE
            ends = c[-1] in ASCII_WHITESPACE or i == n - 1 or chunks[i + 1][0] in ASCII_WHITESPACE
            whole += starts and ends
    by_count = sorted(counts.values(), reverse=True)
    cum = np.cumsum(by_count) if by_count else np.zeros(1, dtype=np.int64)
    stats = {
        "chunks": n,
        "distinct": len(counts),
        "bytes": n_bytes,
        "rate": _share(n, n_bytes),
        "bytes_per_chunk": _share(n_bytes, n),
        "length_hist": hist,
        "multi_word": _share(multi, n),
        "whole_word": _share(whole, n),
        "whitespace_only": _share(ws_only, n),
        "top": [{"chunk": show(c), "count": k, "share": k / n} for c, k in counts.most_common(top)],
    }
    for k in COVERAGE_AT:
        stats[f"coverage_top_{k // 1000}k"] = _share(int(cum[min(k, len(cum)) - 1]), n)
    return stats


def _ends(chunks: list[bytes]) -> set[int]:
    """Byte offsets where a chunk ends inside the text (the end of the text itself is left out:
    every segmentation has it)."""
    return set(np.cumsum([len(c) for c in chunks])[:-1].tolist()) if chunks else set()


def _spans(chunks: list[bytes]) -> set[tuple[int, int]]:
    ends = np.cumsum([len(c) for c in chunks]).tolist()
    return set(zip([0] + ends[:-1], ends))


def overlap_stats(learned: list[bytes], bpe: list[bytes], tok) -> dict:
    """How the learned chunks relate to a BPE segmentation of the same text.

    - in_bpe_vocab: share of learned chunk occurrences whose bytes are one token of the BPE
      vocabulary (whether or not BPE cuts the text there); in_bpe_vocab_distinct: the same
      over distinct chunks.
    - same_span: share of learned chunks that BPE produces as one token at the same position.
    - boundary_recall: share of learned chunk boundaries that are also BPE token boundaries;
      bpe_boundary_recall: share of BPE boundaries that are also learned boundaries.
    - boundary_recall_chance: boundary_recall expected by chance, with learned boundaries placed
      independently of the text: the share of the n_bytes - 1 inner positions that BPE cuts at.
    """
    from rltok.data.bpe import bytes_to_text

    vocab = tok.get_vocab()  # token strings in the latin-1 view: one character per byte
    distinct = set(learned)
    in_vocab = {c for c in distinct if bytes_to_text(c) in vocab}
    n_in = sum(1 for c in learned if c in in_vocab)
    le, be = _ends(learned), _ends(bpe)
    n_bytes = sum(map(len, learned))
    return {
        "in_bpe_vocab": _share(n_in, len(learned)),
        "in_bpe_vocab_distinct": _share(len(in_vocab), len(distinct)),
        "same_span": _share(len(_spans(learned) & _spans(bpe)), len(learned)),
        "boundary_recall": _share(len(le & be), len(le)),
        "bpe_boundary_recall": _share(len(le & be), len(be)),
        # what boundary_recall would be if the learned boundaries fell independently of BPE's
        "boundary_recall_chance": _share(len(be), n_bytes - 1),
    }


# ---- data ----------------------------------------------------------------------------------------

def load_vocab_data(spec: str, split: str = "test", max_bytes: int = 200_000, val_fraction: float = 0.02,
                    read_cap: int = 0, log=None) -> tuple[bytes, bytes | None]:
    """(text to analyse: its first `max_bytes` bytes (0 = all), BPE training bytes or None = fit
    on the text itself).

    Both are the byte streams the data loader (rltok.data.corpus) builds, DOC_SEP (0xFF) between two
    documents, so the model sees the text as it saw its training data. A split folder gives its
    `<split>.*` files and, for the BPE, its `train.*` files. split="all" analyses the whole
    source with no separate BPE data. Otherwise the text is what `load_corpus` holds out for
    validation (whole documents when the source has at least MIN_DOCS_FOR_DOC_SPLIT = 20 of them,
    else the tail of every document; see rltok.data.sources.split_cuts) and the BPE learns from
    the rest, as in training (split="train": the training part, with no separate BPE data).
    `read_cap` caps the bytes read for training data (0 = no cap), e.g. for hub datasets."""
    from rltok.data.corpus import EVAL_SPLITS

    if split not in EVAL_SPLITS:
        raise DataError(f"unknown split {split!r}; valid splits: {', '.join(EVAL_SPLITS)}")
    named = named_split(spec, split)
    if named or split == "all":
        text = load_eval_bytes(spec, split, max_bytes).numpy().tobytes()
        bpe_train = None
        if named and split != "train" and named_split(spec, "train"):
            bpe_train = load_eval_bytes(spec, "train", read_cap).numpy().tobytes()
    else:
        corpus = load_corpus(spec, val_fraction=val_fraction, max_bytes=read_cap)
        if split not in ("val", "train") and log:
            rule = {"documents": "whole held-out documents",
                    "tails": "the held-out tail of every document"}.get(corpus.split, "the end of the stream")
            log(f"note: {spec} has no '{split}' split; using its validation part: {rule} "
                f"(val_fraction={val_fraction})")
        if split == "train":
            text, bpe_train = corpus.train.numpy().tobytes(), None
        else:
            text, bpe_train = corpus.val.numpy().tobytes(), corpus.train.numpy().tobytes()
    text = text[:max_bytes] if max_bytes else text
    if not text:
        raise DataError(f"{spec} ({split} split) holds no bytes to analyse")
    return text, bpe_train


# ---- a BPE at the same rate ----------------------------------------------------------------------

def _sample_blocks(data: bytes, n: int, seed: int = 0, block: int = 1 << 16) -> list[bytes]:
    """About `n` bytes of `data` as random blocks (whole `data` if it is smaller): a corpus of
    several sources then trains the BPE on all of them, not on the first one."""
    if len(data) <= n:
        return [data]
    block = max(1, min(block, len(data) // 20))
    picks = random.Random(seed).sample(range(len(data) // block), min(len(data) // block, -(-n // block)))
    return [data[i * block : (i + 1) * block] for i in sorted(picks)]


def fit_bpe_on_text(train: bytes, text: bytes, target_rate: float, pretokenize: str = "line",
                    sample_bytes: int = 4_000_000, seed: int = 0, max_vocab: int = 65536,
                    vocab_tol: float = 0.005):
    """A BPE trained on `train` whose rate *on `text`* is closest to `target_rate`
    (bpe.fit_bpe_sized_on, with `text` as the bytes it is sized on): a BPE sized on held-out
    blocks of its training split can land 20% off the target on another split of a mixed
    corpus, and the comparison is only fair at equal rates. Returns a bpe.BPEFit."""
    from rltok.data.bpe import fit_bpe_sized_on

    start = time.perf_counter()
    fit = fit_bpe_sized_on(_sample_blocks(train, sample_bytes, seed), [text], target_rate, pretokenize,
                           max_vocab=max_vocab, vocab_tol=vocab_tol)
    fit.reachable = fit.min_rate <= target_rate  # a learned rate is at most 1
    if not fit.reachable:
        fit.note = (
            f"BPE cannot reach rate {target_rate:.4f} with pretokenize={pretokenize!r}: its lowest rate on the text is "
            f"{fit.min_rate:.4f} (vocab {fit.max_vocab_size:,} from {fit.train_bytes:,} training bytes; more "
            f"training bytes{' or pretokenize line' if pretokenize != 'line' else ''} can go lower)")
        warnings.warn(fit.note, stacklevel=2)
    fit.seconds = time.perf_counter() - start
    return fit


# ---- the report ----------------------------------------------------------------------------------

def vocab_report(model, data: bytes, seq_len: int, mode: str = "sample", seed: int = 0, top: int = 30,
                 bpe: bool = True, bpe_data: bytes | None = None, bpe_pretokenize: str = "line",
                 bpe_sample_bytes: int = 4_000_000, device: str | torch.device = "cpu", batch_size: int = 16,
                 log=None) -> dict:
    """Segment `data` with the model, measure its chunks and (unless bpe=False) those of a BPE
    trained on `bpe_data` (default: `data`) and sized to the same rate on `data`, and how the
    two overlap."""
    log = log or (lambda _: None)
    if not data:
        raise DataError("nothing to analyse: the text is empty")
    t0 = time.perf_counter()
    chunks = learned_chunks(model, data, seq_len, mode, seed, device, batch_size)
    learned = chunk_stats(chunks, top)
    result = {
        "bytes": len(data), "mode": mode, "seed": seed, "seq_len": seq_len,
        "chunker": model.cfg.chunker.kind if getattr(model, "hierarchical", False) else type(model).__name__,
        "learned": learned, "seconds_segment": round(time.perf_counter() - t0, 3),
    }
    log(f"segmented {len(data):,} bytes into {learned['chunks']:,} chunks (rate {learned['rate']:.4f}) "
        f"in {result['seconds_segment']:.1f} s")
    if not bpe:
        return result
    fit = fit_bpe_on_text(bpe_data or data, data, learned["rate"], bpe_pretokenize, bpe_sample_bytes, seed)
    tokens = bpe_chunks(fit.tokenizer, data)
    result["bpe"] = {
        **chunk_stats(tokens, top),
        "vocab_size": fit.vocab_size, "pretokenize": bpe_pretokenize, "target_rate": fit.target_rate,
        "reachable": fit.reachable, "min_rate": fit.min_rate, "note": fit.note, "train_bytes": fit.train_bytes,
        "fitted_on": "the train split" if bpe_data else "the analysed text", "seconds": round(fit.seconds, 3),
    }
    result["overlap"] = overlap_stats(chunks, tokens, fit.tokenizer)
    log(f"BPE ({bpe_pretokenize}) vocab {fit.vocab_size:,}: rate {fit.rate:.4f} on the text, "
        f"trained on {fit.train_bytes:,} bytes of {result['bpe']['fitted_on']} in {fit.seconds:.1f} s")
    return result
