"""Byte-exact BPE with HF `tokenizers` (bytes read as latin-1 characters, docs/CONFIG.md, "Boundary
rules and reference models"): training, sizing to a target rate, boundary masks."""

from __future__ import annotations

import json
import random
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from rltok.data.bytes_classes import ASCII_WHITESPACE
from rltok.data.sources import DataError

# Before 0.20 merges were serialised as "a b" strings, which breaks for tokens holding spaces.
if tuple(int(p) for p in tokenizers.__version__.split(".")[:2]) < (0, 20):
    raise ImportError(f"rltok.data.bpe needs tokenizers>=0.20 (found {tokenizers.__version__})")

# bytes_classes.ASCII_WHITESPACE as the body of a regex character class (0x85 and 0xA0 are UTF-8
# continuation bytes here, not spaces); the text stays "\t\n\x0b\x0c\r ", which tokenizers store
_WS = "".join({9: r"\t", 10: r"\n", 13: r"\r", 32: " "}.get(c, rf"\x{c:02x}") for c in sorted(ASCII_WHITESPACE))
# Characters >= 0x80 are named by code point, \x{..}: the regex engine (Oniguruma, on the UTF-8
# form of the text) reads \xff as a raw byte rather than U+00FF, so [\x80-\xff] matches none of
# the characters 0x80-0xFF of the latin-1 view (and [^...\x80-\xff] none of them either).
_LETTER = r"A-Za-z\x{80}-\x{fe}"
_SEP = r"\x{ff}"  # rltok.data.corpus.DOC_SEP, always a pre-token of its own
PRETOKENIZERS = {
    "gpt2": (rf"'(?:[sdmt]|ll|ve|re)| ?[{_LETTER}]+| ?[0-9]+| ?[^{_WS}{_LETTER}0-9{_SEP}]+"
             rf"|[{_WS}]+(?![^{_WS}{_SEP}])|[{_WS}]+|{_SEP}"),
    "line": rf"[^\n{_SEP}]*\n|[^\n{_SEP}]+|{_SEP}",
}
# The patterns before 0xFF was split off (they wrote bytes >= 0x80 as \x80-\xff), which the
# tokenizers in older checkpoints carry: pretokenize_name still recognises them.
_OLD_LETTER = r"A-Za-z\x80-\xff"
_OLD_PRETOKENIZERS = {
    (rf"'(?:[sdmt]|ll|ve|re)| ?[{_OLD_LETTER}]+| ?[0-9]+| ?[^{_WS}{_OLD_LETTER}0-9]+"
     rf"|[{_WS}]+(?![^{_WS}])|[{_WS}]+"): "gpt2",
    r"[^\n]*\n|[^\n]+": "line",
}
ALPHABET = [chr(i) for i in range(256)]
_PIECE = 1 << 16  # texts are fed to the trainer in pieces of at most this many bytes


def bytes_to_text(data: bytes) -> str:
    return bytes(data).decode("latin-1")


def text_to_bytes(text: str) -> bytes:
    return text.encode("latin-1")


def _pre_tokenizer(pretokenize: str):
    if pretokenize not in PRETOKENIZERS:
        raise ValueError(f"unknown pretokenize {pretokenize!r}; choose from {sorted(PRETOKENIZERS)}")
    return pre_tokenizers.Split(Regex(PRETOKENIZERS[pretokenize]), behavior="isolated")


def new_tokenizer(pretokenize: str = "gpt2", vocab: dict[str, int] | None = None,
                  merges: list[tuple[str, str]] | None = None) -> Tokenizer:
    """A byte-exact BPE tokenizer (untrained unless vocab and merges are given)."""
    model = models.BPE(vocab, merges) if vocab is not None else models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer(pretokenize)
    tok.decoder = decoders.Fuse()  # concatenate tokens; the default would join them with spaces
    return tok


def _pieces(data: bytes | Sequence[bytes]) -> list[str]:
    """Texts for the trainer: each document cut into pieces (no token crosses documents)."""
    docs = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    return [bytes_to_text(d[i:i + _PIECE]) for d in docs for i in range(0, len(d), _PIECE)]


def train_bpe(data: bytes | Sequence[bytes], vocab_size: int, pretokenize: str = "gpt2",
              min_frequency: int = 2) -> Tokenizer:
    """Train a byte-exact BPE on `data` (bytes, or a list of documents). Ids 0..255 are the
    single bytes (id = byte value); merges are added in order. Deterministic. The vocabulary can
    come out smaller than `vocab_size` when no pair occurs `min_frequency` times any more."""
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be >= 256 (the byte alphabet), got {vocab_size}")
    tok = new_tokenizer(pretokenize)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=ALPHABET, special_tokens=[])
    tok.train_from_iterator(_pieces(data), trainer)
    return tok


def pretokenize_name(tok: Tokenizer) -> str:
    """Which entry of PRETOKENIZERS a tokenizer was built with."""
    pattern = json.loads(tok.to_str())["pre_tokenizer"]["pattern"]["Regex"]
    known = {p: name for name, p in PRETOKENIZERS.items()} | _OLD_PRETOKENIZERS  # an older checkpoint's too
    if pattern not in known:
        raise ValueError("tokenizer was not built by rltok.data.bpe")
    return known[pattern]


def _vocab_merges(tok: Tokenizer) -> tuple[list[str], list[tuple[str, str]]]:
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    return sorted(vocab, key=vocab.get), [tuple(m) for m in model["merges"]]


def _prefix(id_to_token: list[str], merges: list[tuple[str, str]], vocab_size: int):
    """The vocabulary and merges that training with `vocab_size` would have produced: the trainer
    adds tokens in merge order and stops once the vocabulary is full, so this is a prefix."""
    vocab = {t: i for i, t in enumerate(id_to_token[:vocab_size])}
    n = 0
    while n < len(merges) and merges[n][0] + merges[n][1] in vocab:
        n += 1
    return vocab, merges[:n]


def truncate_bpe(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """`tok` cut down to its first `vocab_size` tokens: the same as training with that size.
    It keeps `tok`'s own pre-tokenizer (an older checkpoint's pattern stays as it was)."""
    id_to_token, merges = _vocab_merges(tok)
    vocab, kept = _prefix(id_to_token, merges, max(256, vocab_size))
    out = new_tokenizer(pretokenize_name(tok), vocab, kept)
    out.pre_tokenizer = tok.pre_tokenizer
    return out


def encode_bytes(tok: Tokenizer, data: bytes) -> list[int]:
    return tok.encode(bytes_to_text(data), add_special_tokens=False).ids


def decode_bytes(tok: Tokenizer, ids: Sequence[int]) -> bytes:
    return text_to_bytes(tok.decode(list(ids), skip_special_tokens=False))


# Token lengths in bytes, per tokenizer. The cache holds the tokenizer itself, so its id() cannot
# be reused by another object while the entry lives; the vocabulary size guards against edits.
_LENGTHS: dict[int, tuple[Tokenizer, np.ndarray]] = {}


def token_lengths(tok: Tokenizer) -> np.ndarray:
    """(vocab,) int64: the number of bytes of every token."""
    hit = _LENGTHS.get(id(tok))
    if hit is not None and len(hit[1]) == tok.get_vocab_size():
        return hit[1]
    lengths = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for t, i in tok.get_vocab().items():
        lengths[i] = len(t)
    if len(_LENGTHS) >= 16:
        _LENGTHS.clear()
    _LENGTHS[id(tok)] = (tok, lengths)
    return lengths


def _rows_as_text(x: torch.Tensor) -> list[str]:
    if x.dim() != 2:
        raise ValueError(f"expected (B, T) byte values, got shape {tuple(x.shape)}")
    x = x.detach().cpu()
    if x.numel() and (int(x.min()) < 0 or int(x.max()) > 255):
        raise ValueError("BPE input must be byte values 0..255 (no specials)")
    return [row.tobytes().decode("latin-1") for row in x.numpy().astype(np.uint8)]


def encode_rows(tok: Tokenizer, x: torch.Tensor) -> tuple[list[list[int]], list[np.ndarray]]:
    """Tokenise each row of (B, T) byte values on its own: token ids and each token's last-byte
    position, per row."""
    rows = _rows_as_text(x)
    encs = tok.encode_batch_fast(rows, add_special_tokens=False)  # _fast skips the offsets
    lengths = token_lengths(tok)
    ids, ends = [], []
    for row, enc in zip(rows, encs):
        e = np.cumsum(lengths[enc.ids]) - 1
        if len(row) and (len(e) == 0 or e[-1] != len(row) - 1):  # only if the vocab was edited
            e = np.array([b - 1 for _, b in tok.encode(row, add_special_tokens=False).offsets], dtype=np.int64)
        ids.append(enc.ids)
        ends.append(e)
    return ids, ends


def bpe_boundary_mask(tok: Tokenizer, x: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True at the last byte of every token when each row is tokenised on its own.
    (The chunkers' forced boundary at position 0 is the caller's to add.)"""
    _, ends = encode_rows(tok, x)
    mask = np.zeros(tuple(x.shape), dtype=bool)
    for i, e in enumerate(ends):
        mask[i, e] = True
    return torch.from_numpy(mask).to(x.device)


def tokenizer_to_tensor(tok: Tokenizer) -> torch.Tensor:
    """The tokenizer's JSON as a uint8 tensor, to keep in a state_dict (safetensors holds tensors)."""
    return torch.frombuffer(bytearray(tok.to_str().encode("utf-8")), dtype=torch.uint8).clone()


def tokenizer_from_tensor(t: torch.Tensor) -> Tokenizer:
    """The tokenizer a model's buffer holds; a buffer that is not a working tokenizer (not UTF-8,
    a merge of unknown tokens, a pre-tokenizer whose regex panics on its first text) is one ValueError."""
    try:
        tok = Tokenizer.from_str(t.detach().cpu().to(torch.uint8).numpy().tobytes().decode("utf-8"))
        # on the CPU whatever the default device (a model is costed on the meta device first)
        encode_rows(tok, torch.tensor([list(b"Probe: words, 123 and code() {}\n\t") + list(range(256))], device="cpu"))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the tokenizers library raises Exception and panics (BaseException)
        raise ValueError(f"not a working tokenizer ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    return tok


@dataclass
class BPEFit:
    """The result of fit_bpe_to_rate; unpacks as (tokenizer, rate, vocab_size)."""

    tokenizer: Tokenizer
    rate: float  # tokens per byte on the held-out bytes
    vocab_size: int
    target_rate: float
    reachable: bool  # False: the target lies outside [rate at the largest vocab, 1]
    min_rate: float  # rate of the largest vocabulary the sample supports
    pretoken_rate: float  # pre-tokens per byte: no vocabulary can go below it
    train_bytes: int
    heldout_bytes: int
    seconds: float
    searched: list[tuple[int, float]] = field(default_factory=list)  # (vocab size, rate), in order
    note: str = ""
    max_vocab_size: int = 0  # the trained vocabulary, before sizing (below max_vocab when merges ran out)
    fit_bytes: int = 0  # bytes of `data` the tokenizer depends on: the merges' sample, plus the held-out one when sized

    def __iter__(self):
        return iter((self.tokenizer, self.rate, self.vocab_size))


def heldout_for(sample_bytes: int) -> int:
    """The held-out sample that goes with a merges' sample of `sample_bytes`: a quarter of it, at
    most 1 MB (fit_bpe_to_rate's default beside its default 4 MB sample)."""
    return min(1_000_000, max(1, sample_bytes // 4))


def _split_blocks(docs: list[bytes], sample_bytes: int, heldout_bytes: int, seed: int):
    """Disjoint train and held-out samples: random blocks of the corpus, chosen by `seed`."""
    total = sum(len(d) for d in docs)
    block = max(1, min(_PIECE, total // 20))  # >= ~20 blocks, so small corpora still split
    blocks = [(d, i) for d in range(len(docs)) for i in range(0, len(docs[d]), block)]
    random.Random(seed).shuffle(blocks)
    if sample_bytes + heldout_bytes > total:  # too small for both: keep the 4:1 proportion
        heldout_bytes = max(1, total // 5)
        sample_bytes = total - heldout_bytes
    train, heldout = [], []
    n_train = n_held = 0
    for d, i in blocks:
        piece = docs[d][i:i + block]
        if n_train < sample_bytes:
            train.append(piece)
            n_train += len(piece)
        elif n_held < heldout_bytes:
            heldout.append(piece)
            n_held += len(piece)
        else:
            break
    if not heldout:  # a corpus of one block: hold out its tail
        piece = train.pop()
        cut = max(1, len(piece) * 4 // 5)
        train.append(piece[:cut])
        heldout.append(piece[cut:] or piece)
    return train, heldout


def fit_bpe_to_rate(data: bytes | Sequence[bytes], target_rate: float, sample_bytes: int = 4_000_000,
                    seed: int = 0, pretokenize: str = "gpt2", heldout_bytes: int = 1_000_000,
                    max_vocab: int = 65536, min_frequency: int = 2, vocab_tol: float = 0.005,
                    vocab_size: int = 0) -> BPEFit:
    """A BPE whose tokens per byte on held-out bytes of `data` is closest to `target_rate`:
    trained on `sample_bytes` of random blocks of `data`, sized on `heldout_bytes` of other blocks
    (fit_bpe_sized_on); deterministic for a seed. Out of reach: the closest one, `reachable=False`,
    the reason in `note` and a warning. `vocab_size` > 0: exactly that many tokens, on the same
    sample (`target_rate` ignored)."""
    start = time.perf_counter()
    docs = [bytes(data)] if isinstance(data, (bytes, bytearray, memoryview)) else [bytes(d) for d in data if len(d)]
    if not docs or not any(docs):
        raise ValueError("fit_bpe_to_rate needs some bytes")
    train, heldout = _split_blocks(docs, sample_bytes, heldout_bytes, seed)
    fit = fit_bpe_sized_on(train, heldout, target_rate, pretokenize, max_vocab, min_frequency, vocab_tol, vocab_size)
    if not fit.reachable:
        if target_rate > 1.0:
            note = f"target rate {target_rate} > 1: a token holds at least one byte"
        else:
            why = (f"merges ran out at vocab {fit.max_vocab_size} (min_frequency={min_frequency}, "
                   f"{fit.train_bytes:,} sample bytes)" if fit.max_vocab_size < max_vocab else f"max_vocab={max_vocab}")
            note = (f"target rate {target_rate} unreachable with pretokenize={pretokenize!r}: the lowest rate is "
                    f"{fit.min_rate:.4f} ({why}); pre-tokens alone give {fit.pretoken_rate:.4f} tokens/byte")
        fit.note = note
        warnings.warn(note + f"; using vocab {fit.vocab_size} at rate {fit.rate:.4f}", stacklevel=2)
    # with vocab_size given, the held-out bytes only measure the rate: the tokenizer is the sample's
    fit.fit_bytes = fit.train_bytes + (0 if vocab_size else fit.heldout_bytes)
    fit.seconds = time.perf_counter() - start
    return fit


def fit_bpe_sized_on(train: Sequence[bytes], heldout: Sequence[bytes], target_rate: float,
                     pretokenize: str = "gpt2", max_vocab: int = 65536, min_frequency: int = 2,
                     vocab_tol: float = 0.005, vocab_size: int = 0) -> BPEFit:
    """A BPE trained on the pieces `train` whose tokens per byte on the pieces `heldout` is closest
    to `target_rate` (reachable: min_rate <= target_rate <= 1). Trains once, at `max_vocab`: a
    smaller vocabulary is a prefix of it (truncate_bpe), so the bisection over vocab size (to within
    `vocab_tol`) only re-encodes the held-out distinct pre-tokens. `vocab_size` > 0: exactly that
    size, reachable by definition (its target is the rate it gets)."""
    start = time.perf_counter()
    if vocab_size:  # (under 256: train_bpe refuses it)
        max_vocab = vocab_size
        # each merge joins at least one pair of the sample's tokens into one: at most one per byte
        if vocab_size - 256 >= sum(map(len, train)):
            raise DataError(f"a BPE of {vocab_size} tokens needs more merges than the sample supplies: "
                            f"{vocab_size - 256:,} merges, and a sample of {sum(map(len, train)):,} bytes has at "
                            "most one per byte; ask for fewer tokens (model.bpe_vocab) or give more training bytes")
    full = train_bpe(train, max_vocab, pretokenize, min_frequency)
    id_to_token, merges = _vocab_merges(full)
    if vocab_size and len(id_to_token) != vocab_size:
        raise DataError(f"a BPE of {vocab_size} tokens needs more merges than the sample supplies: training on "
                        f"{sum(map(len, train)):,} bytes stopped at {len(id_to_token)} tokens "
                        f"(min_frequency={min_frequency}); ask for fewer tokens (model.bpe_vocab) or give more "
                        "training bytes")

    pre = _pre_tokenizer(pretokenize)
    counts: Counter[str] = Counter()
    for piece in heldout:
        counts.update(w for w, _ in pre.pre_tokenize_str(bytes_to_text(piece)))
    words = list(counts)
    weights = np.array([counts[w] for w in words], dtype=np.int64)
    n_bytes = sum(len(p) for p in heldout)

    rates: dict[int, float] = {}
    searched: list[tuple[int, float]] = []

    def rate(v: int) -> float:
        if v not in rates:
            # no pre-tokenizer here: each distinct pre-token is encoded as one word
            model = Tokenizer(models.BPE(*_prefix(id_to_token, merges, v)))
            encs = model.encode_batch_fast(words, add_special_tokens=False)
            n = np.array([len(e.ids) for e in encs], dtype=np.int64)
            rates[v] = float((n * weights).sum()) / n_bytes
            searched.append((v, rates[v]))
        return rates[v]

    lo, hi = 256, len(id_to_token)
    if vocab_size:  # no sizing: the one vocabulary, its rate taken as the target
        target_rate = rate(hi)
    # rate falls (weakly) with vocab size: bisect for the neighbours around the target
    elif rate(hi) < target_rate < rate(lo):
        while hi - lo > max(1, int(vocab_tol * hi)):
            mid = (lo + hi) // 2
            if rate(mid) > target_rate:
                lo = mid
            else:
                hi = mid
    best = min(rates, key=lambda v: (abs(rates[v] - target_rate), v))
    min_rate = rates[len(id_to_token)]
    vocab, kept = _prefix(id_to_token, merges, best)
    return BPEFit(tokenizer=new_tokenizer(pretokenize, vocab, kept), rate=rates[best], vocab_size=len(vocab),
                  target_rate=target_rate, reachable=min_rate <= target_rate <= 1.0, min_rate=min_rate,
                  pretoken_rate=float(weights.sum()) / n_bytes, train_bytes=sum(map(len, train)),
                  heldout_bytes=n_bytes, seconds=time.perf_counter() - start, searched=searched,
                  max_vocab_size=len(id_to_token))


__all__ = ["BPEFit", "PRETOKENIZERS", "bpe_boundary_mask", "bytes_to_text", "decode_bytes", "encode_bytes",
           "encode_rows", "fit_bpe_sized_on", "fit_bpe_to_rate", "new_tokenizer", "pretokenize_name", "text_to_bytes",
           "token_lengths", "tokenizer_from_tensor", "tokenizer_to_tensor", "train_bpe", "truncate_bpe"]
