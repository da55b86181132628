"""A BPE-token transformer, the reference that reads tokens instead of bytes: each row is tokenised
on its own, token j >= 1's nats are reported at its last byte (token 0 is not scored), and the
tokenizer lives in the state_dict as a uint8 buffer of its JSON."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from rltok.config import ModelConfig
from rltok.data.bpe import encode_rows, fit_bpe_to_rate, heldout_for, tokenizer_from_tensor, tokenizer_to_tensor
from rltok.model.cost import Level
from rltok.model.layers import param_count
from rltok.model.output import LMOutput
from rltok.model.plain_lm import PlainLM


class BPETokenLM(PlainLM):
    arch = "bpe_token"

    def __init__(self, tokenizer: Tokenizer, d_model: int, n_layers: int, n_heads: int, mlp_ratio: float = 4.0,
                 max_tokens: int = 2048, rope_base: float = 10000.0, dropout: float = 0.0,
                 vocab_size: int | None = None):
        # vocab_size: `unfitted`'s shape without a placeholder tokenizer of that many tokens
        vocab_size = vocab_size or tokenizer.get_vocab_size()
        super().__init__(vocab_size, d_model, n_layers, n_heads, mlp_ratio, rope_base, None, dropout)
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size
        self.register_buffer("tokenizer_json", tokenizer_to_tensor(tokenizer), persistent=True)
        self.tokenizer = tokenizer

    reads_tokens = True  # a BPE tokenizer of its own (PretrainedMixin.reads_tokens)

    @staticmethod
    def fitted_to_data(cfg) -> bool:
        """Its BPE tokenizer is fitted to the training bytes."""
        return True

    def chunks_per_byte(self, x: torch.Tensor, generator=None) -> float:
        """Tokens per byte of windows x (B, T) under its tokenizer."""
        ids, _ = encode_rows(self.tokenizer, x)
        return sum(len(r) for r in ids) / x.numel()

    def shape_facts(self) -> dict:
        """Depth, width and vocabulary, for result tables (see HourglassLM.shape_facts)."""
        return {**super().shape_facts(), "bpe_vocab": int(self.vocab_size), "ngram_rows": None,
                "chunk_vocab_rows": None}

    @staticmethod
    def card_facts(m: dict) -> tuple[str, list[tuple[str, str]], bool]:
        """What the model card says of it (see HourglassLM.card_facts)."""
        return ("a BPE-token transformer (rltok's tokenized reference; bpb over the bytes its tokens cover)",
                [("layers", f"{m['flat_layers']} x d={m['d_chunk']}"), ("tokenizer", "BPE, stored in the weights")],
                False)

    @classmethod
    def _from_config(cls, cfg: ModelConfig, train_bytes: torch.Tensor | None, state_dict) -> BPETokenLM:
        facts = {}
        if state_dict is not None and "tokenizer_json" in state_dict:
            tok = tokenizer_from_tensor(state_dict["tokenizer_json"].cpu())
        elif train_bytes is not None:
            # model.bpe_vocab > 0: exactly that vocabulary, on the sample the rate fit would use
            fit = fit_bpe_to_rate(bytes(train_bytes.numpy()), cfg.target_rate, cfg.bpe_sample_bytes,
                                  pretokenize=cfg.bpe_pretokenize, heldout_bytes=heldout_for(cfg.bpe_sample_bytes),
                                  vocab_size=cfg.bpe_vocab)
            tok, facts = fit.tokenizer, {"tokenizer_fit_bytes": fit.fit_bytes}
        else:
            raise ValueError("model.arch=bpe_token needs training bytes to fit its tokenizer")
        model = cls(tok, cfg.d_chunk, cfg.flat_layers, cfg.n_heads_chunk, cfg.mlp_ratio, max_tokens=cfg.max_seq_len,
                    rope_base=cfg.rope_base, dropout=cfg.dropout)
        model.set_fit_facts(facts)
        return model

    @classmethod
    def unfitted(cls, cfg: ModelConfig, vocab_size: int | None = None) -> BPETokenLM:
        """The model of `cfg` over `vocab_size` tokens (default model.bpe_vocab), with a one-token
        placeholder tokenizer (one of every token took seconds and gigabytes for millions)."""
        size = vocab_size or cfg.bpe_vocab
        if not size:
            raise ValueError("a BPE-token model's shape needs its vocabulary size (model.bpe_vocab or vocab_size)")
        tok = Tokenizer(WordLevel({"t0": 0}, unk_token="t0"))
        return cls(tok, cfg.d_chunk, cfg.flat_layers, cfg.n_heads_chunk, cfg.mlp_ratio, max_tokens=cfg.max_seq_len,
                   rope_base=cfg.rope_base, dropout=cfg.dropout, vocab_size=size)

    def forward_flops(self, seq_len: int, rate: float | None = None, rate2: float | None = None,
                      kernel: bool = False) -> dict[str, float]:
        """Forward FLOPs per byte at `rate` tokens per byte (default: model.target_rate), each token
        running the stack and the output layer. `kernel`: attention as its kernel computes."""
        if rate is None:
            if getattr(self, "model_config", None) is None:
                raise ValueError("pass the tokens per byte: this model has no config to take a target from")
            rate = self.model_config.target_rate
        tokens = Level(max(1, int(seq_len * rate)), 1.0, kernel)
        per_token = self.stack_flops(tokens)
        return {**{k: rate * v for k, v in per_token.items()}, "total": rate * sum(per_token.values())}

    def non_embedding_params(self) -> int:
        """Parameters outside the vocabulary (embedding and output layer): one shape counts the same
        at any vocabulary."""
        return param_count(self) - param_count(self.embed, self.head)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The checkpoint's tokenizer replaces ours, whatever its JSON length: resize the buffer
        # first so the default loader's shape check passes, and rebuild the Tokenizer object.
        key = prefix + "tokenizer_json"
        saved = state_dict.get(key)
        if saved is not None and not (saved.shape == self.tokenizer_json.shape
                                      and torch.equal(saved.cpu(), self.tokenizer_json.cpu())):
            try:
                tok = tokenizer_from_tensor(saved)
            except Exception as e:  # malformed JSON: report it like any other load error
                error_msgs.append(f"{key}: not a tokenizer ({type(e).__name__}: {e})")
            else:
                if tok.get_vocab_size() != self.vocab_size:
                    error_msgs.append(f"{key}: checkpoint tokenizer has {tok.get_vocab_size()} tokens, "
                                      f"this model {self.vocab_size}; build the model from that tokenizer")
                else:
                    self.tokenizer_json = torch.empty_like(saved, device=self.tokenizer_json.device)
                    self.tokenizer = tok
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def encode(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokenise each row of (B, T) bytes: token ids (B, N) padded with 0, each token's last
        byte position (B, N) (0 in padding), and tokens per row (B,), all on idx's device."""
        ids, ends = encode_rows(self.tokenizer, idx)
        return self._padded(ids, ends, idx.device)

    def encode_split(self, w: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`encode` with a token boundary forced after byte `context` - 1: each row's bytes before
        `context` and from `context` on tokenised on their own and concatenated. Also returns
        (B,) the index of each row's first token from `context` on."""
        head_ids, head_ends = encode_rows(self.tokenizer, w[:, :context])
        tail_ids, tail_ends = encode_rows(self.tokenizer, w[:, context:])
        ids = [h + t for h, t in zip(head_ids, tail_ids)]
        ends = [np.concatenate([h, t + context]) for h, t in zip(head_ends, tail_ends)]
        first = torch.tensor([len(h) for h in head_ids], dtype=torch.long, device=w.device)
        return (*self._padded(ids, ends, w.device), first)

    def _padded(self, ids: list[list[int]], ends: list[np.ndarray], dev) -> tuple[torch.Tensor, ...]:
        counts = np.array([len(i) for i in ids], dtype=np.int64)
        n_max = max(1, int(counts.max()) if len(counts) else 1)
        if n_max > self.max_tokens:
            raise ValueError(f"a row holds {n_max} tokens, more than max_tokens={self.max_tokens}")
        tok = np.zeros((len(ids), n_max), dtype=np.int64)
        end = np.zeros((len(ids), n_max), dtype=np.int64)
        for r, (i, e) in enumerate(zip(ids, ends)):
            tok[r, : len(i)] = i
            end[r, : len(e)] = e
        return torch.from_numpy(tok).to(dev), torch.from_numpy(end).to(dev), torch.from_numpy(counts).to(dev)

    def forward(self, idx: torch.Tensor, **_: object) -> LMOutput:
        """Training: tokens 1..N-1 of each row scored at their last byte (token 0 has no context)."""
        tok, end, counts = self.encode(idx)
        return self._scored_tokens(tok, end, counts, torch.ones_like(counts), idx.shape[1], shift=0)

    def score_window(self, w: torch.Tensor, context: int, split: bool = True) -> LMOutput:
        """Evaluation: the loss on bytes `context`.. of whole windows w (B, T+1), attributed to the
        (B, T) targets w[:, 1:]. `split`: a token boundary is forced before byte `context`, so
        exactly the bytes w[context:] count, as for a byte model; without it the window is tokenised
        whole and scoring starts at its first token boundary at or after `context`."""
        if not 1 <= context < w.shape[1]:
            raise ValueError(f"context must be 1..{w.shape[1] - 1} for windows of {w.shape[1]} bytes, got {context}")
        if split:
            tok, end, counts, first = self.encode_split(w, context)
        else:
            tok, end, counts = self.encode(w)
            # the first token that starts at or after `context` (the one after the last ending before it)
            first = (end < context - 1).logical_and(torch.arange(tok.shape[1], device=w.device) < counts[:, None])
            first = first.sum(1) + 1
        return self._scored_tokens(tok, end, counts, first, w.shape[1] - 1)

    def _scored_tokens(self, tok, end, counts, first, length: int, shift: int = 1) -> LMOutput:
        """Tokens first..count-1 of each row scored (each predicted from the tokens before it), their
        nats put at their last byte, `shift` positions earlier (1: a window byte k is target k - 1)."""
        bsz, n = tok.shape
        logits = self.token_logits(tok[:, :-1]) if n > 1 else self.head(self.embed(tok[:, :0]))
        nll = F.cross_entropy(logits.float().flatten(0, 1), tok[:, 1:].flatten(), reduction="none").view(bsz, n - 1)
        j = torch.arange(1, n, device=tok.device)
        scored = (j >= first.unsqueeze(1)) & (j < counts.unsqueeze(1))
        nll = torch.where(scored, nll, torch.zeros_like(nll))
        byte_nll = torch.zeros(bsz, length, dtype=nll.dtype, device=tok.device).scatter_add(
            1, torch.where(scored, end[:, 1:] - shift, 0), nll)  # padding adds 0 at position 0
        start = end.gather(1, (first - 1).clamp(max=n - 1).unsqueeze(1)) + 1 - shift  # the first scored byte
        byte_mask = (torch.arange(length, device=tok.device) >= start) & (first < counts).unsqueeze(1)
        return LMOutput(None, n_chunks=counts, byte_nll=byte_nll, byte_mask=byte_mask)
