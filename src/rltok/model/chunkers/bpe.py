"""Boundaries at the ends of BPE tokens: a tokenizer fitted to the target rate decides the cuts."""

from __future__ import annotations

import torch

from rltok.model.chunkers.base import Boundaries, Chunker


class BPEChunker(Chunker):
    """Boundaries at the ends of BPE tokens (each row tokenised on its own). The tokenizer is
    fitted to the target rate on the training split and stored as a buffer, so checkpoints
    carry it. Note: a BPE boundary at t depends on whether byte t+1 merges with it and, through
    the merges of the whole pre-token, on the bytes up to the end of the word, so this rule sees
    the future through its boundaries. (Dynamic pooling's "unigram" variant instead trains a causal
    predictor on the tokenizer's cuts and pools at the predictor's.)"""

    noncausal = ("chunker=bpe cannot generate: a BPE boundary at byte t depends on whether byte t+1 merges "
                 "with it and on the rest of its word, so it cannot be decided before those bytes exist")

    needs_fit = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate, m.bpe_pretokenize, m.bpe_vocab, m.bpe_sample_bytes)

    def __init__(self, rate: float, pretokenize: str = "gpt2", vocab_size: int = 0, sample_bytes: int = 4_000_000):
        super().__init__()
        self.rate = rate
        self.pretokenize = pretokenize
        self.vocab_size = vocab_size  # > 0: exactly this vocabulary instead of the one fitted to `rate`
        self.sample_bytes = sample_bytes  # of the training split, to fit on (model.bpe_sample_bytes)
        self.register_buffer("tokenizer_json", torch.zeros(0, dtype=torch.uint8))
        self._tok = None

    def fit(self, data: bytes, seed: int = 0):
        """Fit the tokenizer on a sample of `data`; returns the rltok.data.bpe.BPEFit."""
        from rltok.data.bpe import fit_bpe_to_rate, heldout_for, tokenizer_to_tensor

        fit = fit_bpe_to_rate(data, self.rate, self.sample_bytes, seed=seed, pretokenize=self.pretokenize,
                              heldout_bytes=heldout_for(self.sample_bytes), vocab_size=self.vocab_size)
        self.tokenizer_json = tokenizer_to_tensor(fit.tokenizer).to(self.tokenizer_json.device)
        self._tok = fit.tokenizer
        return fit

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "tokenizer_json"
        if key in state_dict:
            self.tokenizer_json = torch.empty_like(state_dict[key])
            self._tok = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def tokenizer(self):
        if self._tok is None:
            if self.tokenizer_json.numel() == 0:
                raise RuntimeError("BPE chunker has no tokenizer: call fit() on training bytes first")
            from rltok.data.bpe import tokenizer_from_tensor

            self._tok = tokenizer_from_tensor(self.tokenizer_json.cpu())
        return self._tok

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            from rltok.data.bpe import bpe_boundary_mask

            b = bpe_boundary_mask(self.tokenizer, idx.cpu()).to(forced.device)
        return Boundaries(b=b.bool() | forced, free=~forced)
