"""The hierarchical byte LM (docs/ARCHITECTURE.md, "One training step"): HourglassLM is the byte-level
Stage (stage.py); here is what only bytes have (embedding, heads, the projections to the chunk
width) and the public passes."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from rltok.config import VOCAB_SIZE, ModelConfig
from rltok.model.chunk_vocab import ChunkVocab
from rltok.model.ngram_embed import NgramEmbedding, byte_input
from rltok.model.chunkers import NonCausalRule, build_chunker, forced_mask
from rltok.model.chunkers.base import DECISION_MODES
from rltok.model.cost import Level, linear_flops, module_flops
from rltok.model.decoding import HourglassState, StepOutput, put_row
from rltok.model.generate import Decodes
from rltok.model.layers import Packing, Stack, param_count
from rltok.model.levels import LevelSpec, chunk_levels
from rltok.model.output import HourglassOutput
from rltok.model.pretrained import PretrainedMixin
from rltok.model.stage import Pass, Stage


class ValueHead(nn.Module):
    """Critic V(s_t) on the encoder state and the share of the window still to come (a discounted
    return shrinks towards its end). It never sees b_t, so as a baseline it adds no bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, dim), nn.GELU(), nn.Linear(dim, 1))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        length = h.shape[1]
        remaining = torch.arange(length, 0, -1, device=h.device, dtype=h.dtype) / length
        feats = torch.cat([h, remaining.view(1, length, 1).expand(h.shape[0], -1, -1)], dim=-1)
        return self.net(feats)


class HourglassLM(Stage, PretrainedMixin, Decodes):
    depth = 0  # the byte level
    arch = "hourglass"
    hierarchical = True  # draws segmentations (K per sequence with group baselines)

    def __init__(self, cfg: ModelConfig, levels: Sequence[LevelSpec] | None = None):
        """`levels`: the stages below the bytes, top down (default: those the config describes,
        chunk_levels(cfg)); the main network runs at the bottom, at the last level's width."""
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        levels = chunk_levels(cfg) if levels is None else list(levels)
        chunk_dim = levels[0].width if levels else cfg.d_chunk  # what the byte level's chunks become
        self.embed = nn.Embedding(VOCAB_SIZE, cfg.d_byte)
        # the byte n-grams ending at each byte, hashed into learned tables (model.ngram_vocab)
        self.ngram_embed = NgramEmbedding(cfg.ngram_sizes, cfg.ngram_vocab, cfg.d_byte) if cfg.ngram_vocab else None
        kw = dict(mlp_ratio=cfg.mlp_ratio, rope_base=cfg.rope_base, dropout=cfg.dropout)
        self.encoder = Stack(cfg.encoder_layers, cfg.d_byte, cfg.n_heads_byte, window=cfg.window, **kw)
        self.early_head = nn.Linear(cfg.d_byte, VOCAB_SIZE, bias=False)
        self.chunker = build_chunker(cfg)
        self.down = nn.Linear(cfg.d_byte, chunk_dim, bias=False)
        # a learned vocabulary of chunk contents, added to the chunk vectors (model.chunk_vocab)
        self.chunk_vocab = ChunkVocab(cfg.chunk_vocab, chunk_dim, cfg.chunk_vocab_max_len) if cfg.chunk_vocab else None
        # the residual depth the output projections are scaled by: every layer of every level
        n_layers = cfg.encoder_layers + cfg.main_layers + cfg.decoder_layers + 2 * sum(lv.layers for lv in levels)
        self.build_main(levels, cfg.main_layers, n_layers, cfg.pack_chunks, kw, cfg.d_chunk, cfg.n_heads_chunk)
        self.up = nn.Linear(chunk_dim, cfg.d_byte, bias=False)
        self.decoder = Stack(cfg.decoder_layers, cfg.d_byte, cfg.n_heads_byte, window=cfg.window, **kw)
        self.head = nn.Linear(cfg.d_byte, VOCAB_SIZE, bias=False)
        # the critic reads the encoder state detached: its regression never reshapes the encoder
        self.value_head = ValueHead(cfg.d_byte) if cfg.value_head else None
        self.init_stacks(n_layers)
        for lin in (self.early_head, self.down, self.up, self.head):
            nn.init.normal_(lin.weight, 0.0, 0.02)
        nn.init.normal_(self.embed.weight, 0.0, 1.0)
        self.dim, self.pack = cfg.d_byte, cfg.pack_chunks
        # chunks per item each level below aims at (what its cost is planned with)
        self.level_targets = tuple(cfg.target_rate if lv.target_rate is None else lv.target_rate for lv in levels)

    @staticmethod
    def card_facts(m: dict) -> tuple[str, list[tuple[str, str]], bool]:
        """The model card's sentence, shape rows and whether it reads bytes, for config `m` (a dict)."""
        from rltok.config import CHUNKERS

        chunker = m["chunker"]
        settings = ", ".join(f"{k}={v}" for k, v in chunker.items() if k != "kind")
        shape = [("boundary rule", chunker["kind"] + (f" ({settings})" if settings else "")),
                 ("target rate", m["target_rate"]),
                 ("byte level", f"d={m['d_byte']}, {m['encoder_layers']} encoder + {m['decoder_layers']} decoder "
                                f"layers, sliding window {m['window']}"),
                 ("chunk level", f"d={m['d_chunk']}, {m['main_layers']} layers, full causal attention")]
        what = ("a byte-level hierarchical language model: an encoder over bytes, a boundary rule that "
                "decides where each chunk ends, a main network over the chunks and a decoder back to bytes")
        if CHUNKERS.component(chunker["kind"]).learned:
            what += "; the boundaries are drawn by a policy trained with reinforcement learning"
        return what, shape, True

    @classmethod
    def _from_config(cls, cfg: ModelConfig, train_bytes: torch.Tensor | None, state_dict) -> HourglassLM:
        model = cls(cfg)
        if model.chunker.needs_fit and state_dict is None:
            if train_bytes is None:
                raise ValueError(f"model.chunker={cfg.chunker.kind} needs training bytes to fit it")
            fit = model.chunker.fit(bytes(train_bytes.numpy()))
            model.set_fit_facts({"tokenizer_fit_bytes": fit.fit_bytes})
        return model

    @staticmethod
    def fitted_to_data(cfg: ModelConfig) -> bool:
        """Whether a model of config `cfg` fits a part to the training bytes (its boundary rule)."""
        from rltok.config import CHUNKERS

        return CHUNKERS.component(cfg.chunker.kind).needs_fit

    @torch.no_grad()
    def chunks_per_byte(self, x: torch.Tensor, generator: torch.Generator | None = None) -> float:
        """Chunks per byte the rule draws on windows x (B, T) in eval mode."""
        was = self.training
        self.eval()
        out = self(x, generator=generator)
        self.train(was)
        return out.boundaries.b.float().mean().item()

    def shape_facts(self) -> dict:
        """Depth, width and vocabulary rows, for result tables."""
        m = self.cfg
        mid = f"{m.stage2_layers}+{m.main_layers}+{m.stage2_layers}" if m.stages == 2 else f"{m.main_layers}"
        return {"depth": f"{m.encoder_layers}+{mid}+{m.decoder_layers}", "width": f"{m.d_byte}/{m.d_chunk}",
                "bpe_vocab": None, "ngram_rows": m.ngram_vocab * len(m.ngram_sizes), "chunk_vocab_rows": m.chunk_vocab}

    @classmethod
    def unfitted(cls, cfg: ModelConfig, vocab_size: int | None = None) -> HourglassLM:
        return cls(cfg)  # a BPE rule's tokenizer left empty

    # what K segmentations of one sequence (objective.group_size) share: one encoder pass
    group_shared = ("encoder", "encoder_attn", "early_head")
    # what the tokenizer phase runs besides the rule: the byte input, the encoder, the early exit
    encoder_side = ("ngram", "encoder", "encoder_attn", "early_head")

    def forward_flops(self, seq_len: int, rate: float | None = None, rate2: float | None = None,
                      kernel: bool = False) -> dict[str, float]:
        """Forward FLOPs per byte on windows of `seq_len` bytes at `rate` chunks per byte and `rate2`
        supertokens per chunk (default: the targets), by component: `*_attn` attention, `policy`
        the rule's layers, `smoothing` H-Net's EMA, `stage2` a chunk stage's own; `byte_level` +
        `chunk_level` (scaled by the rate) = `total`. `kernel`: attention as its kernel computes."""
        rate = self.cfg.target_rate if rate is None else rate
        rates = self.level_targets if rate2 is None else (rate2, *self.level_targets[1:])
        byte = Level(seq_len, 1.0, kernel)
        chunks = byte.below(rate)
        chunk_level = {"down": linear_flops(self.down, chunks) + module_flops(self.chunk_vocab, chunks),
                       **self.body_flops(chunks, rates),
                       "up": linear_flops(self.up, chunks), "smoothing": self.chunker.chunk_flops(chunks, self.dim)}
        for key in ("stage2", "stage2_attn"):  # reported (as 0) with one stage too
            chunk_level.setdefault(key, 0.0)
        out = {"ngram": module_flops(self.ngram_embed, byte), "encoder": self.encoder.linear_flops(byte),
               "encoder_attn": self.encoder.attention_flops(byte), "early_head": linear_flops(self.early_head, byte),
               "policy": module_flops(self.chunker, byte), "value_head": module_flops(self.value_head, byte),
               **chunk_level,
               "decoder": self.decoder.linear_flops(byte), "decoder_attn": self.decoder.attention_flops(byte),
               "head": linear_flops(self.head, byte)}
        out["chunk_level"] = sum(chunk_level.values())
        out["byte_level"] = sum(v for k, v in out.items() if k not in chunk_level and k != "chunk_level")
        out["total"] = out["byte_level"] + out["chunk_level"]
        return out

    def non_embedding_params(self) -> int:
        """Parameters outside the lookup tables (the size a scaling law counts)."""
        return param_count(self) - param_count(self.embed, self.ngram_embed, self.chunk_vocab)

    def chunk_input(self, z: torch.Tensor, idx: torch.Tensor, chunk_pos: torch.Tensor,
                    packing: Packing | None = None) -> torch.Tensor:
        """The projected chunk vectors (packed with `packing`), plus their chunk-vocabulary entries."""
        z = self.down(z)
        if self.chunk_vocab is not None:
            v = self.chunk_vocab(idx, chunk_pos)
            z = z + (v if packing is None else packing.unpad(v)).to(z.dtype)
        return z

    def to_chunks(self, z: torch.Tensor, chunk_pos: torch.Tensor, packing: Packing | None,
                  run: Pass) -> torch.Tensor:
        return self.chunk_input(z, run.ids, chunk_pos, packing)

    def to_chunks_step(self, state: HourglassState, z: torch.Tensor, rows) -> torch.Tensor:
        # with a chunk vocabulary: two chunks, the previous one only marks where this one starts
        window, cpos = state.chunk_window(rows) if self.chunk_vocab is not None else (None, None)
        state.chunk_start[rows] = state.pos[rows] + 1
        return self.chunk_input(z.unsqueeze(1), window, cpos)[:, -1]

    def from_chunks(self, z: torch.Tensor) -> torch.Tensor:
        return self.up(z)

    def embed_bytes(self, idx: torch.Tensor) -> torch.Tensor:
        return byte_input(self.embed, self.ngram_embed, idx)

    def encode(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """The encoder's output (B, T, d_byte) for byte ids idx (B, T)."""
        if idx.shape[1] > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {idx.shape[1]} bytes exceeds model.max_seq_len={self.cfg.max_seq_len}")
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.encoder(self.embed_bytes(idx), pos, cache=cache)

    def forward(self, idx: torch.Tensor, generator: torch.Generator | None = None, group_size: int = 1,
                encoder_only: bool = False, *, mode: str = "sample", force_last: bool | None = None
                ) -> HourglassOutput:
        """Training and evaluation: idx (B, T) byte ids, segmented by the rules of every level
        (`mode` "sample" or "greedy"). group_size K > 1: K segmentations per sequence share one
        encoder pass (row b*K + k). `encoder_only` (the tokenizer phase; a flag, as data-parallel
        wrappers call forward): stop after the byte rule, the early-exit logits standing in for the
        model's. `force_last`: whether the last byte closes a chunk (default: the config's)."""
        if mode not in DECISION_MODES:  # any other word would silently sample
            raise ValueError(f"mode must be 'sample' or 'greedy', got {mode!r}")
        h = self.encode(idx)
        early_logits = self.early_head(h)
        if group_size > 1:
            h, early_logits, idx = (t.repeat_interleave(group_size, 0) for t in (h, early_logits, idx))
        return self._run(idx, h, early_logits, Pass(idx, mode, generator, (), None), force_last, encoder_only)

    def score(self, idx: torch.Tensor, boundaries: torch.Tensor, below: Sequence[torch.Tensor | None] = (), *,
              mode: str = "sample", generator: torch.Generator | None = None,
              force_last: bool | None = None) -> HourglassOutput:
        """The model on a fixed segmentation: boundaries (B, T) bool, byte t closes a chunk (the
        forced positions close one whatever they say). `below`: the fixed decisions of the levels
        below the bytes, top down, (B, M) per item of that level (a two-stage model's supertokens
        per chunk); a level not given decides by its rule (`mode`, `generator`)."""
        h = self.encode(idx)
        run = Pass(idx, mode, generator, (boundaries, *below), None)
        return self._run(idx, h, self.early_head(h), run, force_last)

    def rerun(self, idx: torch.Tensor, encoded: HourglassOutput, boundaries: torch.Tensor) -> HourglassOutput:
        """The counterfactual pass: the model on another segmentation `boundaries` (rows as in
        `encoded`) of the bytes idx that `encoded` came from, reusing its encoder state and
        early-exit logits, detached; only what comes after the encoder runs. The levels below
        the bytes decide again."""
        h, early_logits = encoded.encoder_state.detach(), encoded.early_logits.detach()
        return self._run(idx, h, early_logits, Pass(idx, "sample", None, (boundaries,), None), None)

    def _run(self, idx: torch.Tensor, h: torch.Tensor, early_logits: torch.Tensor, run: Pass,
             force_last: bool | None, encoder_only: bool = False) -> HourglassOutput:
        """Everything after the encoder: the byte level's rule (fixed by run.given[0] if given),
        then down -> the levels below -> up -> decoder -> head."""
        length = idx.shape[1]
        force_last = self.cfg.force_last_boundary if force_last is None else force_last
        values = self.value_head(h.detach()).squeeze(-1) if self.value_head is not None else None
        forced = forced_mask(idx.shape[0], length, idx.device, force_last)
        bd = self.chunker(h, forced, run.decided(0), run.mode, run.generator, idx=idx, early_logits=early_logits)
        if encoder_only:
            return HourglassOutput(early_logits, early_logits=early_logits, boundaries=bd, values=values,
                                   encoder_state=h)
        out, levels = self.hourglass(h, bd, torch.arange(length, device=idx.device), run)
        return HourglassOutput(self.head(out), early_logits=early_logits, boundaries=bd, values=values,
                               encoder_state=h, levels=levels)

    # ---- cached decoding: one byte per row through the same modules ------------------------

    def decoding_state(self, batch: int, capacity: int, mode: str = "sample",
                       generator: torch.Generator | None = None) -> HourglassState:
        """What start_decoding makes: needs a causal boundary rule."""
        if self.chunker.noncausal:
            raise NonCausalRule(self.chunker.noncausal)
        return HourglassState(self, batch, capacity, mode, generator)

    @torch.inference_mode()
    def prefill(self, state: HourglassState, row: int, ids: torch.Tensor, boundaries: torch.Tensor | None = None,
                start: int = 0, boundaries2=None) -> StepOutput:
        """Read one row's context ids (T,) with the parallel pass, replacing whatever it held.
        boundaries (T,) fix its decisions (the last byte is not forced); boundaries2 those of the
        levels below, (T,) or one (T,) per level, top down. `start`: the row's byte index of ids[0]
        (after a slide). Returns the last byte's logits and the per-byte decisions."""
        x = ids.view(1, -1).to(state.device)
        given = None if boundaries is None else boundaries.view(1, -1).to(state.device).bool()
        below = [b.view(1, -1).to(state.device).bool() for b in as_levels(boundaries2)]
        if below and given is None:
            raise ValueError("boundaries2 needs the boundaries they group")
        cache = state.prefill_cache(row)
        h = self.encode(x, cache)
        early_logits = self.early_head(h)
        run = Pass(x, state.mode, state.generator, (given, *per_item(given, below)), cache)
        out = self._run(x, h, early_logits, run, force_last=False)
        b = out.boundaries.b
        state.start_row(row, x)
        for level in range(len(state.levels)):
            state.levels[level].latest[row] = cache.kept[f"latest{level}"][0, -1]
        rule = self.chunker.start_state(out.encoder_state, b, x, out.early_logits, start)
        put_row(state.levels[0].rule, row, rule, state.batch)
        ends = torch.nonzero(b[0]).flatten()
        state.chunk_start[row] = ends[-1] + 1
        decided = self._start_levels(state, row, x, out, cache)
        logits = out.boundaries.logits
        return StepOutput(out.logits[0, -1], b[0], None if logits is None else logits[0], tuple(decided))

    def _start_levels(self, state: HourglassState, row: int, x: torch.Tensor, out: HourglassOutput,
                      cache) -> list[torch.Tensor]:
        """After prefill's pass: each level below the bytes counts the items it read and starts
        its rule's state. Returns each level's decisions per byte (T,)."""
        decided = out.per_byte_levels()
        closes = [out.boundaries.b[0]] + decided  # the bytes that close each level's items
        for depth, (stage, level) in enumerate(zip(self.stages()[1:], out.levels), start=1):
            state.levels[depth].n[row] = int(closes[depth - 1].sum())
            items = x[:, level.pos[0]]  # each item's last byte
            rule = stage.chunker.start_state(cache.kept[f"encoded{depth}"], level.boundaries.b, items, None)
            put_row(state.levels[depth].rule, row, rule, state.batch)
        return decided

    @torch.inference_mode()
    def step(self, state: HourglassState, ids: torch.Tensor, boundaries: torch.Tensor | None = None,
             boundaries2=None, noise: torch.Tensor | None = None) -> StepOutput:
        """Read one byte per row, ids (B,). boundaries (B,) fix its decisions, boundaries2 those
        of the levels below ((B,) for the first, or a sequence of them, top down); noise (B,
        levels) are the uniform draws for them (None: drawn from the state's generator)."""
        dev = state.device
        ids = ids.to(dev)
        given = None if boundaries is None else boundaries.to(dev).bool()
        noise = None if noise is None else noise.to(dev)
        state.push(ids)
        pos = state.pos
        x = state.embed_newest(self.embed_bytes)  # (with its n-grams)
        h = self.encoder.step(x.unsqueeze(1), pos, state.caches[self.encoder])[:, 0]
        early = self.early_head(h) if self.chunker.uses_early_logits else None
        bd = self.chunker.step(state.levels[0].rule, h, pos == 0, given, state.mode, state.generator, idx=ids,
                               early_logits=early, noise=None if noise is None else noise[:, 0])
        out, below = self.hourglass_step(state, h, bd, pos, None,
                                         tuple(b.to(dev).bool() for b in as_levels(boundaries2)),
                                         None if noise is None else noise[:, 1:])
        state.advance()
        return StepOutput(self.head(out), bd.b, bd.logits, tuple(below))


def as_levels(given) -> tuple:
    """Decisions of the levels below the bytes as prefill and step take them: None, one tensor
    (the first level), or a sequence of tensors (top down) -> a tuple of tensors."""
    if given is None:
        return ()
    return (given,) if isinstance(given, torch.Tensor) else tuple(given)


def per_item(given: torch.Tensor | None, below: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-byte decisions (1, T) of each level below the bytes -> per item of that level, as the
    parallel pass takes them: level 1's items are the bytes that close a chunk (byte 0 always
    does), level 2's those that also close an item of level 1, and so on."""
    if given is None:
        return []
    closes = given.clone()
    closes[:, 0] = True
    items = []
    for b in below:
        items.append(b[closes].view(1, -1))
        closes = closes & b
        closes[:, 0] = True  # an item of every level ends at byte 0
    return items
