"""The hierarchical byte LM: encoder -> boundaries -> chunk-level main network -> decoder.

    bytes -> embed -> encoder (local attention) -+-> early-exit head (next byte)
                                                 +-> chunker -> b_t
    downsample: the encoder vector at each boundary byte is its chunk's vector
    main network over chunks (full causal attention, RoPE at the chunks' byte positions; the
    batch's chunks run packed end to end, attention alone padded per sequence: pack_chunks)
    upsample: byte t receives the main output of the latest chunk ending at or before t,
    added to the encoder output (skip) -> decoder (local attention) -> head (next byte)

Causality: the chunk ending at byte s only sees bytes <= s and decisions <= s, and byte t only
receives chunks that end at or before t, so the prediction for byte t+1 depends on bytes <= t.

With model.stages=2 the main network is itself an hourglass over chunks (SupertokenStage):
chunk encoder -> a second policy that closes supertokens -> main network over supertokens ->
chunk j receives the latest supertoken ending at or before j -> chunk decoder. The same
argument, one level up, keeps it causal.

Cached decoding (start_decoding / prefill / step, below the forward) runs the same modules: a
context is read by this forward pass given a cache, then each new byte goes through the encoder
against its caches, the boundary rule's one-byte decision (Chunker.step), the chunk level only
when that byte closes a chunk, the decoder and the head. Causality is what makes the two agree.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from rltok.config import VOCAB_SIZE, ModelConfig
from rltok.model.chunk_vocab import ChunkVocab
from rltok.model.ngram_embed import NgramEmbedding, byte_input
from rltok.model.chunkers import Boundaries, NonCausalRule, RLPolicy, build_chunker, forced_mask
from rltok.model.decoding import HourglassState, StepOutput, put_row
from rltok.model.noise import uniform
from rltok.model.layers import Packing, Stack, init_weights
from rltok.model.output import ModelOutput


def chunk_index(b: torch.Tensor) -> torch.Tensor:
    """For each byte, the index of the latest chunk that ends at or before it."""
    return torch.cumsum(b.long(), dim=1) - 1


def counts(n: torch.Tensor) -> tuple[int, int]:
    """The largest and the total of per-row counts n (B,): one host sync."""
    top, total = torch.stack([n.max(), n.sum()]).tolist()
    return int(top), int(total)


def packing_for(n: torch.Tensor, width: int, total: int, enabled: bool) -> Packing | None:
    """How to pack rows of n (B,) items (`width` the largest, `total` their sum), or None when
    packing is off or would save nothing (every row equally long)."""
    return Packing(n, width, total) if enabled and total < n.shape[0] * width else None


def boundary_positions(b: torch.Tensor, n_max: int) -> torch.Tensor:
    """(B, n_max) byte positions of the boundaries in order; padding slots hold 0."""
    bsz, length = b.shape
    idx = torch.where(b, chunk_index(b), n_max)  # non-boundaries go to a discarded slot
    pos = torch.zeros(bsz, n_max + 1, dtype=torch.long, device=b.device)
    pos.scatter_(1, idx, torch.arange(length, device=b.device).expand(bsz, length))
    return pos[:, :n_max]


class ValueHead(nn.Module):
    """Critic V(s_t): a small MLP on the encoder state and the share of the window still to
    come (a discounted return over the rest of the window shrinks towards its end). It never
    sees b_t, so as a baseline it leaves the policy gradient unbiased."""

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


def ema_over_chunks(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """zbar_j = p_j z_j + (1 - p_j) zbar_{j-1}: a confident boundary keeps its own chunk, an
    unsure one leans on the previous chunk (H-Net's smoothing; gives p a gradient).

    Unrolled as zbar_j = sum_{i<=j} p_i prod_{i<k<=j} (1 - p_k) z_i: one (M x M) weight matrix
    from cumulative log(1 - p), so there is no loop over chunks; exponents are <= 0 (stable).
    """
    p = p.float().clamp(0.0, 1.0)
    log_keep = torch.cumsum(torch.log1p(-p.clamp(max=1 - 1e-6)), dim=1)  # (B, M)
    expo = log_keep.unsqueeze(2) - log_keep.unsqueeze(1)  # [b, j, i] = L_j - L_i
    causal = torch.ones(p.shape[1], p.shape[1], dtype=torch.bool, device=p.device).tril()
    weights = torch.where(causal, expo, float("-inf")).exp() * p.unsqueeze(1)
    return torch.bmm(weights.to(z.dtype), z)


def ema_step(z: torch.Tensor, prev: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """ema_over_chunks for one new chunk: zbar = p z + (1 - p) zbar_prev, with p clamped as there.
    z, prev (n, d); p (n,)."""
    p = p.float().clamp(0.0, 1.0)
    keep = 1 - p.clamp(max=1 - 1e-6)
    return (p.unsqueeze(-1) * z + keep.unsqueeze(-1) * prev).to(z.dtype)


class SupertokenStage(nn.Module):
    """The second stage: chunks of chunks, in place of the main network of a one-stage model.

    Works on the (B, M) downsampled chunk vectors, or with `packing` on the real ones packed
    (1, N), and then returns them packed; supertokens are packed when cfg.pack_chunks is on.
    The second policy decides per chunk whether it closes a supertoken (on the padded layout:
    it is one linear head); its noise is drawn per byte and read at the chunk's last byte, so a
    decision never depends on how many chunks the future holds (sampling stays causal).
    """

    def __init__(self, cfg: ModelConfig, n_layers: int):
        super().__init__()
        kw = dict(mlp_ratio=cfg.mlp_ratio, rope_base=cfg.rope_base, dropout=cfg.dropout)
        self.encoder = Stack(cfg.stage2_layers, cfg.d_chunk, cfg.n_heads_chunk, window=None, **kw)
        self.chunker = RLPolicy(cfg.d_chunk, 1, cfg.stage2_target_rate, cfg.policy_detach)
        self.main = Stack(cfg.main_layers, cfg.d_chunk, cfg.n_heads_chunk, window=None, **kw)
        self.decoder = Stack(cfg.stage2_layers, cfg.d_chunk, cfg.n_heads_chunk, window=None, **kw)
        for stack in (self.encoder, self.main, self.decoder):
            init_weights(stack, n_layers)
        self.pack = cfg.pack_chunks

    def forward(self, z: torch.Tensor, chunk_pos: torch.Tensor, n_chunks: torch.Tensor, n_bytes: int,
                boundaries: torch.Tensor | None, mode: str, generator, cache=None,
                packing: Packing | None = None) -> tuple[torch.Tensor, Boundaries]:
        bsz, m = chunk_pos.shape
        hc = self.encoder(z, chunk_pos, cache=cache, packing=packing)
        if packing is not None:
            hc = packing.pad(hc)
        valid = torch.arange(m, device=z.device).unsqueeze(0) < n_chunks.unsqueeze(1)
        forced = torch.zeros_like(valid)
        forced[:, 0] = True  # every chunk has a supertoken ending at or before it
        noise = None
        if boundaries is None and mode != "greedy":
            noise = torch.gather(uniform((bsz, n_bytes), z.device, generator), 1, chunk_pos)
        bd = self.chunker(hc, forced, boundaries, mode, generator, noise=noise)
        bd.b = bd.b & valid  # padding slots close nothing and carry no gradient
        bd.free = bd.free & valid
        n_super = bd.b.sum(1)
        s_max, s_total = counts(n_super)
        super_idx = boundary_positions(bd.b, s_max)  # chunk index of each supertoken
        zs = torch.gather(hc, 1, super_idx.unsqueeze(-1).expand(-1, -1, hc.shape[-1]))
        packing2 = packing_for(n_super, s_max, s_total, self.pack and cache is None)
        if packing2 is not None:
            zs = packing2.unpad(zs)
        zs = self.main(zs, torch.gather(chunk_pos, 1, super_idx), cache=cache,  # RoPE at the supertokens' last bytes
                       packing=packing2)
        if packing2 is not None:
            zs = packing2.pad(zs)
        if cache is not None:
            cache.keep("chunk_states", hc)
            cache.keep("supertokens", zs)
        up = torch.gather(zs, 1, chunk_index(bd.b).unsqueeze(-1).expand(-1, -1, zs.shape[-1]))
        x = hc + up
        return self.decoder(x if packing is None else packing.unpad(x), chunk_pos, cache=cache, packing=packing), bd

    def step(self, state: HourglassState, c: torch.Tensor, pos: torch.Tensor, rows: list[int] | None,
             given: torch.Tensor | None, noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows (None: all) whose newest byte closed a chunk, c (n, d_chunk) their chunk
        vectors at byte positions pos (n,): each chunk is encoded against the chunk-level caches,
        the second rule decides whether it closes a supertoken (the main network then runs), and
        the chunk decoder gives its output (n, d_chunk). Also returns those decisions (n,)."""
        r = slice(None) if rows is None else torch.tensor(rows, device=c.device)
        hc = self.encoder.step(c.unsqueeze(1), pos, state.caches[self.encoder], rows)[:, 0]
        sub = {k: v[r] for k, v in state.chunker2.items()}
        bd = self.chunker.step(sub, hc, state.n_chunks[r] == 0, given, state.mode, state.generator, noise=noise)
        for k, v in sub.items():
            state.chunker2[k][r] = v
        state.n_chunks[r] += 1
        close = torch.nonzero(bd.b).flatten().tolist()  # host sync: which rows run the main network
        if close:
            all_rows = list(range(state.batch)) if rows is None else rows
            sel = [all_rows[i] for i in close]
            zs = self.main.step(hc[close].unsqueeze(1), pos[close], state.caches[self.main],
                                None if len(sel) == state.batch else sel)
            state.latest2[sel] = zs[:, 0]
        out = self.decoder.step((hc + state.latest2[r]).unsqueeze(1), pos, state.caches[self.decoder], rows)
        return out[:, 0], bd.b


class HourglassLM(nn.Module):  # generate / save_pretrained / from_pretrained: rltok.model_methods
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB_SIZE, cfg.d_byte)
        # the byte n-grams ending at each byte, hashed into learned tables (model.ngram_vocab)
        self.ngram_embed = NgramEmbedding(cfg.ngram_sizes, cfg.ngram_vocab, cfg.d_byte) if cfg.ngram_vocab else None
        kw = dict(mlp_ratio=cfg.mlp_ratio, rope_base=cfg.rope_base, dropout=cfg.dropout)
        self.encoder = Stack(cfg.encoder_layers, cfg.d_byte, cfg.n_heads_byte, window=cfg.window, **kw)
        self.early_head = nn.Linear(cfg.d_byte, VOCAB_SIZE, bias=False)
        self.chunker = build_chunker(cfg)
        self.down = nn.Linear(cfg.d_byte, cfg.d_chunk, bias=False)
        # a learned vocabulary of chunk contents, added to the chunk vectors (model.chunk_vocab)
        self.chunk_vocab = ChunkVocab(cfg.chunk_vocab, cfg.d_chunk, cfg.chunk_vocab_max_len) if cfg.chunk_vocab else None
        n_layers = cfg.encoder_layers + cfg.main_layers + cfg.decoder_layers
        if cfg.stages == 2:
            self.stage2 = SupertokenStage(cfg, n_layers + 2 * cfg.stage2_layers)
            self.main = None
        else:
            self.stage2 = None
            self.main = Stack(cfg.main_layers, cfg.d_chunk, cfg.n_heads_chunk, window=None, **kw)
        self.up = nn.Linear(cfg.d_chunk, cfg.d_byte, bias=False)
        self.decoder = Stack(cfg.decoder_layers, cfg.d_byte, cfg.n_heads_byte, window=cfg.window, **kw)
        self.head = nn.Linear(cfg.d_byte, VOCAB_SIZE, bias=False)
        # the critic reads the encoder state detached: its regression never reshapes the encoder
        self.value_head = ValueHead(cfg.d_byte) if cfg.value_head else None
        if cfg.stages == 2:
            n_layers += 2 * cfg.stage2_layers
        for stack in (self.encoder, self.main, self.decoder):
            if stack is not None:
                init_weights(stack, n_layers)
        for lin in (self.early_head, self.down, self.up, self.head):
            nn.init.normal_(lin.weight, 0.0, 0.02)
        nn.init.normal_(self.embed.weight, 0.0, 1.0)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def chunk_input(self, z: torch.Tensor, idx: torch.Tensor, chunk_pos: torch.Tensor,
                    packing: Packing | None = None) -> torch.Tensor:
        """The main network's input: the projected chunk vectors, plus each chunk's entry in the
        learned chunk vocabulary when there is one (z packed with `packing`; chunk_pos padded)."""
        z = self.down(z)
        if self.chunk_vocab is not None:
            v = self.chunk_vocab(idx, chunk_pos)
            z = z + (v if packing is None else packing.unpad(v)).to(z.dtype)
        return z

    def embed_bytes(self, idx: torch.Tensor) -> torch.Tensor:
        """The encoder's input: each byte's embedding, plus its n-grams' when there are any."""
        return byte_input(self.embed, self.ngram_embed, idx)

    def encode(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.encoder(self.embed_bytes(idx), pos, cache=cache)

    def forward(self, idx: torch.Tensor, boundaries: torch.Tensor | None = None, mode: str = "sample",
                generator: torch.Generator | None = None, force_last: bool | None = None,
                group_size: int = 1, boundaries2: torch.Tensor | None = None,
                encoded: tuple[torch.Tensor, torch.Tensor] | None = None, cache=None) -> ModelOutput:
        """idx: (B, T) byte ids. `boundaries` (B, T) bool fixes the segmentation; otherwise the
        chunker draws one (`mode` "sample" or "greedy"). With group_size K > 1, K segmentations
        of every sequence share one encoder pass and the outputs have B*K rows (row b*K + k).
        `boundaries2` (B, M) bool fixes a two-stage model's supertoken decisions per chunk.
        `encoded` = (encoder_state, early_logits) of an earlier call on the same idx skips the
        encoder (a counterfactual segmentation re-runs only what comes after it). `cache`: a
        PrefillCache for one row (decoding; see prefill), which every layer stack fills."""
        length = idx.shape[1]
        if length > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {length} bytes exceeds model.max_seq_len={self.cfg.max_seq_len}")
        force_last = self.cfg.force_last_boundary if force_last is None else force_last
        pos = torch.arange(length, device=idx.device)
        if encoded is None:
            h = self.encode(idx, cache)
            early_logits = self.early_head(h)
        else:
            h, early_logits = encoded
        if group_size > 1:
            h, early_logits, idx = (t.repeat_interleave(group_size, 0) for t in (h, early_logits, idx))
        bsz = idx.shape[0]
        values = self.value_head(h.detach()).squeeze(-1) if self.value_head is not None else None
        forced = forced_mask(bsz, length, idx.device, force_last)
        bd = self.chunker(h, forced, boundaries, mode, generator, idx=idx, early_logits=early_logits)

        n_chunks = bd.b.sum(1)
        n_max, total = counts(n_chunks)  # the one host sync per step: the chunk counts
        chunk_pos = boundary_positions(bd.b, n_max)
        z = torch.gather(h, 1, chunk_pos.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        if bd.gate is not None:  # straight-through rules: value 1, gradient to the boundary score
            z = z * torch.gather(bd.gate, 1, chunk_pos).unsqueeze(-1).to(z.dtype)
        # Packed, the chunk level computes only the real chunks (attention pads them per row).
        # Padded, padding chunks sit after every real chunk, so causal attention keeps them unseen.
        packing = packing_for(n_chunks, n_max, total, self.cfg.pack_chunks and cache is None)
        if packing is not None:
            z = packing.unpad(z)
        bd2 = None
        if self.stage2 is not None:
            z, bd2 = self.stage2(self.chunk_input(z, idx, chunk_pos, packing), chunk_pos, n_chunks, length,
                                 boundaries2, mode, generator, cache=cache, packing=packing)
        else:
            z = self.main(self.chunk_input(z, idx, chunk_pos, packing), chunk_pos, cache=cache, packing=packing)
        z = self.up(z)
        if packing is not None:  # back to (B, M): the EMA and the upsampling work per sequence
            z = packing.pad(z)
        if bd.smooth is not None:  # H-Net: EMA over chunks, weighted by boundary probability
            z = ema_over_chunks(z, torch.gather(bd.smooth, 1, chunk_pos))
        if cache is not None:
            cache.keep("chunks", z)
        up = torch.gather(z, 1, chunk_index(bd.b).unsqueeze(-1).expand(-1, -1, z.shape[-1]))
        if bd.confidence is not None:
            up = up * bd.confidence.unsqueeze(-1).to(up.dtype)
        logits = self.head(self.decoder(h + up, pos, cache=cache))
        return ModelOutput(logits=logits, early_logits=early_logits, boundaries=bd, n_chunks=n_chunks,
                           values=values, boundaries2=bd2, chunk_pos=chunk_pos if bd2 is not None else None,
                           n_chunks2=None if bd2 is None else bd2.b.sum(1), encoder_state=h)

    # ---- cached decoding: one byte per row through the same modules ------------------------

    def start_decoding(self, batch: int, capacity: int, mode: str = "sample",
                       generator: torch.Generator | None = None) -> HourglassState:
        """Caches for `batch` rows of up to `capacity` bytes each. `mode` decides boundaries as in
        forward ("sample" / "greedy"), drawing from `generator`. Needs eval mode (no dropout, no
        threshold updates) and a causal boundary rule."""
        if self.training:
            raise ValueError("decode with the model in eval mode (model.eval())")
        if self.chunker.noncausal:
            raise NonCausalRule(self.chunker.noncausal)
        return HourglassState(self, batch, capacity, mode, generator)

    @torch.inference_mode()
    def prefill(self, state: HourglassState, row: int, ids: torch.Tensor, boundaries: torch.Tensor | None = None,
                start: int = 0, boundaries2: torch.Tensor | None = None) -> StepOutput:
        """Read one row's context ids (T,) with the forward pass, replacing whatever the row held.
        boundaries (T,) fix its decisions (byte 0 always closes a chunk; the last one is not
        forced), boundaries2 (T,) the bytes that close a supertoken (two stages; with
        boundaries). `start`: the row's byte index of ids[0] (after a slide, which passes the
        decisions it keeps), from which a fixed stride goes on counting in the steps. Returns the
        last byte's next-byte logits and the per-byte decisions."""
        x = ids.view(1, -1).to(state.device)
        given = None if boundaries is None else boundaries.view(1, -1).to(state.device).bool()
        given2 = None
        if boundaries2 is not None:  # per byte -> per chunk, as forward takes them
            if given is None:
                raise ValueError("boundaries2 needs the boundaries they group")
            ends = given.clone()
            ends[:, 0] = True
            given2 = boundaries2.view(1, -1).to(state.device).bool()[ends].view(1, -1)
        cache = state.prefill_cache(row)
        out = self(x, given, state.mode, state.generator, force_last=False, boundaries2=given2, cache=cache)
        b = out.boundaries.b
        state.start_row(row, x)
        put_row(state.chunker, row, self.chunker.start_state(out.encoder_state, b, x, out.early_logits, start),
                state.batch)
        state.latest[row] = cache.kept["chunks"][0, -1]
        ends = torch.nonzero(b[0]).flatten()
        state.chunk_start[row] = ends[-1] + 1
        b2 = None
        if self.stage2 is not None:
            bd2 = out.boundaries2.b
            state.n_chunks[row] = len(ends)
            state.latest2[row] = cache.kept["supertokens"][0, -1]
            rule2 = self.stage2.chunker.start_state(cache.kept["chunk_states"], bd2, None, None)
            put_row(state.chunker2, row, rule2, state.batch)
            b2 = torch.zeros_like(b[0])
            b2[ends] = bd2[0]
        logits = out.boundaries.logits
        return StepOutput(out.logits[0, -1], b[0], None if logits is None else logits[0], b2)

    @torch.inference_mode()
    def step(self, state: HourglassState, ids: torch.Tensor, boundaries: torch.Tensor | None = None,
             boundaries2: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> StepOutput:
        """Read one byte per row, ids (B,). boundaries / boundaries2 (B,) fix its decisions;
        noise (B, stages) are the uniform draws for them (None: drawn from the state's generator)."""
        dev = state.device
        ids = ids.to(dev)
        given = None if boundaries is None else boundaries.to(dev).bool()
        state.push(ids)
        pos = state.pos
        x = state.embed_newest(self.embed_bytes)  # (with its n-grams)
        h = self.encoder.step(x.unsqueeze(1), pos, state.caches[self.encoder])[:, 0]
        early = self.early_head(h) if self.chunker.uses_early_logits else None
        bd = self.chunker.step(state.chunker, h, pos == 0, given, state.mode, state.generator, idx=ids,
                               early_logits=early, noise=None if noise is None else noise[:, 0].to(dev))
        rows = torch.nonzero(bd.b).flatten().tolist()  # host sync: which rows reach the chunk level
        b2 = None if self.stage2 is None else torch.zeros_like(bd.b)
        if rows:
            sel = None if len(rows) == state.batch else rows
            r = slice(None) if sel is None else torch.tensor(rows, device=dev)
            z = h[r] if bd.gate is None else h[r] * bd.gate[r].unsqueeze(-1).to(h.dtype)
            window, cpos = state.chunk_window(r) if self.chunk_vocab is not None else (None, None)
            # (with a chunk vocabulary: two chunks, the previous one only marks where this one starts)
            c = self.chunk_input(z.unsqueeze(1), window, cpos)[:, -1]
            if self.stage2 is not None:
                z, b2[r] = self.stage2.step(state, c, pos[r], sel,
                                            None if boundaries2 is None else boundaries2.to(dev).bool()[r],
                                            None if noise is None else noise[r, 1].to(dev))
            else:
                z = self.main.step(c.unsqueeze(1), pos[r], state.caches[self.main], sel)[:, 0]
            z = self.up(z)
            if bd.smooth is not None:
                z = ema_step(z, state.latest[r], bd.smooth[r])
            state.latest[r] = z
            state.chunk_start[r] = pos[r] + 1
        up = state.latest if bd.confidence is None else state.latest * bd.confidence.unsqueeze(-1).to(h.dtype)
        out = self.decoder.step((h + up).unsqueeze(1), pos, state.caches[self.decoder])
        state.advance()
        return StepOutput(self.head(out[:, 0]), bd.b, bd.logits, b2)
