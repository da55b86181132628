"""One level of the hourglass, recursive as in H-Net: items -> encoder -> boundary rule -> down (a
chunk is its last item's state, or what the rule pools) -> main (a Stack or the next Stage) -> up
(each item gets its latest chunk, plus a skip) -> decoder; written once for the parallel pass, once
for the cached step."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn as nn

from rltok.model import cost  # (cost.Level: where a module runs; Level here: a level as a pass decided it)
from rltok.model.chunkers import Boundaries
from rltok.model.chunkers.base import last_item_chunks
from rltok.model.decoding import HourglassState
from rltok.model.layers import Packing, Stack, init_weights
from rltok.model.levels import LevelSpec
from rltok.model.noise import uniform
from rltok.model.output import Level


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


def ema_over_chunks(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """zbar_j = p_j z_j + (1 - p_j) zbar_{j-1} (H-Net's smoothing; gives p a gradient), unrolled as
    one (M x M) weight matrix from cumulative log(1 - p): no loop over chunks, exponents <= 0."""
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


class Pass(NamedTuple):
    """What every level of one parallel pass shares."""

    ids: torch.Tensor  # (B, T) byte ids (the chunk vocabulary reads them; T sizes the noise)
    mode: str  # "sample" or "greedy"
    generator: object
    given: tuple  # fixed decisions per level, top down: (B, T) at the bytes, (B, M) per chunk below; or None
    cache: object  # a PrefillCache when reading a context for decoding, else None

    def decided(self, depth: int) -> torch.Tensor | None:
        """The fixed decisions of level `depth`, or None (the rule decides)."""
        return self.given[depth] if depth < len(self.given) else None


class Stage(nn.Module):
    """The hourglass of one level. Subclasses build `encoder`, `chunker`, `decoder`, the main
    network (`build_main`), `depth` (0: bytes), `dim` (item width) and `pack` (chunks run packed),
    and define `to_chunks` / `to_chunks_step` (the main network's input from the chunks' last
    encoder states) and `from_chunks` (its output as what the items receive)."""

    depth: int
    dim: int
    pack: bool

    def set_main(self, main: nn.Module) -> None:
        """Make `main` the main network, named `main` (a Stack) or `stage{n}` (a Stage; n counts
        levels from 1 at the bytes) in checkpoints, as models have always saved it."""
        self._main_key = f"stage{self.depth + 2}" if isinstance(main, Stage) else "main"
        self._modules[self._main_key] = main  # (add_module would take the property below for a clash)

    def build_main(self, below: Sequence[LevelSpec], main_layers: int, n_layers: int, pack: bool, kw: dict,
                   width: int, heads: int) -> None:
        """The main network: the stage of the next level down (below[0]), or at the bottom a
        Stack of `main_layers` full-attention layers of `width`. `n_layers`: the residual depth
        every level's output projections are scaled by; `kw`: the Stack settings all levels share."""
        if below:
            self.set_main(ChunkStage(below[0], below[1:], main_layers, n_layers, self.depth + 1, pack, kw))
        else:
            self.set_main(Stack(main_layers, width, heads, window=None, **kw))

    def init_stacks(self, n_layers: int) -> None:
        """GPT-2 initialise this stage's stacks (a stage below initialised its own when built)."""
        for stack in (self.encoder, self.main, self.decoder):
            if isinstance(stack, Stack):
                init_weights(stack, n_layers)

    @property
    def main(self) -> nn.Module:
        """The main network over this stage's chunks: a Stack, or the Stage below."""
        try:
            return self._modules[self._main_key]
        except (AttributeError, KeyError):
            raise AttributeError("the stage has no main network yet (set_main)") from None

    def stages(self) -> list[Stage]:
        """This stage and those below it, top down."""
        return [self] + (self.main.stages() if isinstance(self.main, Stage) else [])

    def stacks(self) -> list[Stack]:
        """Every layer stack of this stage and those below (each has a KV cache in decoding)."""
        inner = self.main.stacks() if isinstance(self.main, Stage) else [self.main]
        return [self.encoder, self.decoder] + inner

    def body_flops(self, chunks: cost.Level, rates: tuple[float, ...]) -> dict[str, float]:
        """Forward FLOPs per byte of the main network on `chunks`, by component (`rates`: items per
        item above, for each level below this one)."""
        if isinstance(self.main, Stage):
            return self.main.stage_flops(chunks, rates)
        return {"main": self.main.linear_flops(chunks), "main_attn": self.main.attention_flops(chunks)}

    def hourglass(self, h: torch.Tensor, bd: Boundaries, pos: torch.Tensor, run: Pass,
                  packing: Packing | None = None) -> tuple[torch.Tensor, list[Level]]:
        """down -> main -> up -> decoder, from this level's encoder states h (B, L, d) (padded)
        and decisions bd (B, L). pos: the items' byte positions, (L,) for bytes or (B, L).
        `packing`: how the items arrived packed; the decoder output leaves packed the same way.
        Returns it and the levels below as they decided."""
        n = bd.b.sum(1)
        n_max, total = counts(n)  # the one host sync per level: the chunk counts
        last = boundary_positions(bd.b, n_max)  # each chunk's last item
        chunk_pos = torch.gather(pos.expand(h.shape[0], -1), 1, last)  # RoPE at the chunks' last bytes
        pool = getattr(self.chunker, "pool", None) or last_item_chunks  # (a plugin's bare module has none)
        z = pool(h, bd, last)
        # Packed, the main network computes only the real chunks (attention pads them per row).
        # Padded, padding chunks sit after every real chunk, so causal attention keeps them unseen.
        inner = packing_for(n, n_max, total, self.pack and run.cache is None)
        if inner is not None:
            z = inner.unpad(z)
        z = self.to_chunks(z, chunk_pos, inner, run)
        if isinstance(self.main, Stage):
            z, below = self.main(z, chunk_pos, n, run, packing=inner)
        else:
            z, below = self.main(z, chunk_pos, cache=run.cache, packing=inner), []
        z = self.from_chunks(z)
        if inner is not None:  # back to (B, M): the EMA and the upsampling work per sequence
            z = inner.pad(z)
        if bd.smooth is not None:  # H-Net: EMA over chunks, weighted by boundary probability
            z = ema_over_chunks(z, torch.gather(bd.smooth, 1, last))
        if run.cache is not None:  # what decoding continues from
            run.cache.keep(f"encoded{self.depth}", h)
            run.cache.keep(f"latest{self.depth}", z)
        up = torch.gather(z, 1, chunk_index(bd.b).unsqueeze(-1).expand(-1, -1, z.shape[-1]))
        if bd.confidence is not None:
            up = up * bd.confidence.unsqueeze(-1).to(up.dtype)
        x = h + up
        out = self.decoder(x if packing is None else packing.unpad(x), pos, cache=run.cache, packing=packing)
        return out, below

    def hourglass_step(self, state: HourglassState, h: torch.Tensor, bd: Boundaries, pos: torch.Tensor,
                       rows: list[int] | None, given: tuple, noise: torch.Tensor | None
                       ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """hourglass for one new item in each of the rows `rows` (None: all): h (n, d) at byte
        positions pos (n,), decisions bd (n,); given / noise: the lower levels' fixed decisions and
        uniform draws. Returns (n, d) and the lower levels' decisions."""
        level = state.levels[self.depth]
        below = [torch.zeros_like(bd.b) for _ in self.stages()[1:]]
        close = torch.nonzero(bd.b).flatten().tolist()  # host sync: which rows go down a level
        if close:
            sel = close if rows is None else [rows[i] for i in close]  # those rows in the batch
            mine = slice(None) if len(close) == len(bd.b) else torch.tensor(close, device=h.device)
            batch = slice(None) if len(sel) == state.batch else torch.tensor(sel, device=h.device)
            z = (h if bd.pooled is None else bd.pooled.to(h.dtype))[mine]
            if bd.gate is not None:
                z = z * bd.gate[mine].unsqueeze(-1).to(h.dtype)
            z = self.to_chunks_step(state, z, batch)
            sub = None if len(sel) == state.batch else sel
            if isinstance(self.main, Stage):
                z, decided = self.main.step(state, z, pos[mine], sub,
                                            tuple(None if g is None else g[mine] for g in given),
                                            None if noise is None else noise[mine])
                for b, d in zip(below, decided):
                    b[mine] = d
            else:
                z = self.main.step(z.unsqueeze(1), pos[mine], state.caches[self.main], sub)[:, 0]
            z = self.from_chunks(z)
            if bd.smooth is not None:
                z = ema_step(z, level.latest[batch], bd.smooth[mine])
            level.latest[batch] = z
        up = level.latest[slice(None) if rows is None else torch.tensor(rows, device=h.device)]
        if bd.confidence is not None:
            up = up * bd.confidence.unsqueeze(-1).to(h.dtype)
        out = self.decoder.step((h + up).unsqueeze(1), pos, state.caches[self.decoder], rows)
        return out[:, 0], below


class ChunkStage(Stage):
    """A stage over the chunks of the stage above (model.stages=2: supertokens), built from a
    LevelSpec. Its items arrive as (B, M) chunk vectors (or packed (1, N)) and leave the same way.
    The noise is drawn per byte and read at each item's last byte, so sampling stays causal."""

    def __init__(self, spec: LevelSpec, below: Sequence[LevelSpec], main_layers: int, n_layers: int,
                 depth: int, pack: bool, kw: dict):
        super().__init__()
        self.depth, self.dim, self.pack = depth, spec.width, pack
        self.encoder = Stack(spec.layers, spec.width, spec.heads, window=None, **kw)
        self.chunker = spec.chunker(spec.width)
        if getattr(self.chunker, "uses_early_logits", False):
            raise ValueError(f"{type(self.chunker).__name__} reads the early-exit head, which only the bytes have")
        self.build_main(below, main_layers, n_layers, pack, kw, spec.width, spec.heads)
        self.decoder = Stack(spec.layers, spec.width, spec.heads, window=None, **kw)
        self.init_stacks(n_layers)
        # to the width of the level below and back, when it has another
        main_dim = below[0].width if below else spec.width
        self.down, self.up = nn.Identity(), nn.Identity()
        if main_dim != spec.width:
            self.down = nn.Linear(spec.width, main_dim, bias=False)
            self.up = nn.Linear(main_dim, spec.width, bias=False)
            for lin in (self.down, self.up):
                nn.init.normal_(lin.weight, 0.0, 0.02)

    def to_chunks(self, z: torch.Tensor, chunk_pos: torch.Tensor, packing: Packing | None,
                  run: Pass) -> torch.Tensor:
        return self.down(z)

    def to_chunks_step(self, state: HourglassState, z: torch.Tensor, rows) -> torch.Tensor:
        return self.down(z)

    def from_chunks(self, z: torch.Tensor) -> torch.Tensor:
        return self.up(z)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, n: torch.Tensor, run: Pass,
                packing: Packing | None = None) -> tuple[torch.Tensor, list[Level]]:
        """x: the chunk vectors (packed with `packing`), pos (B, M) their byte positions, n (B,)
        how many of each row's are real."""
        bsz, m = pos.shape
        h = self.encoder(x, pos, cache=run.cache, packing=packing)
        if packing is not None:
            h = packing.pad(h)
        valid = torch.arange(m, device=x.device).unsqueeze(0) < n.unsqueeze(1)
        forced = torch.zeros_like(valid)
        forced[:, 0] = True  # every item has a chunk ending at or before it
        given = run.decided(self.depth)
        noise = None
        if given is None and run.mode != "greedy":
            noise = torch.gather(uniform((bsz, run.ids.shape[1]), x.device, run.generator), 1, pos)
        bd = self.chunker(h, forced, given, run.mode, run.generator, idx=torch.gather(run.ids, 1, pos), noise=noise)
        bd.b = bd.b & valid  # padding slots close nothing and carry no gradient
        bd.free = bd.free & valid
        out, below = self.hourglass(h, bd, pos, run, packing)
        return out, [Level(bd, pos)] + below

    def stage_flops(self, items: cost.Level, rates: tuple[float, ...]) -> dict[str, float]:
        """Forward FLOPs per byte of this stage on `items` (the chunks above): `stage{n}` its encoder,
        decoder and rule, `stage{n}_attn` their attention, and the main network's components."""
        name = f"stage{self.depth + 1}"
        below = items.below(rates[0])
        unit = items.per_item()
        own = self.encoder.linear_flops(unit) + self.decoder.linear_flops(unit) + cost.module_flops(self.chunker, unit)
        return {**self.body_flops(below, rates[1:]),
                name: items.per_byte * own + self.chunker.chunk_flops(below, self.dim),
                name + "_attn": self.encoder.attention_flops(items) + self.decoder.attention_flops(items)}

    def step(self, state: HourglassState, x: torch.Tensor, pos: torch.Tensor, rows: list[int] | None,
             given: tuple, noise: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The rows (None: all) whose newest item above closed a chunk, x (n, d) their chunk vectors
        at byte positions pos (n,): encoded, decided, then hourglass_step. Returns the output
        (n, d) and the decisions (n,) of this level and those below."""
        level = state.levels[self.depth]
        r = slice(None) if rows is None else torch.tensor(rows, device=x.device)
        h = self.encoder.step(x.unsqueeze(1), pos, state.caches[self.encoder], rows)[:, 0]
        sub = {k: v[r] for k, v in level.rule.items()}
        bd = self.chunker.step(sub, h, level.n[r] == 0, given[0] if given else None, state.mode, state.generator,
                               idx=state.recent[r, -1], noise=None if noise is None else noise[:, 0])
        for k, v in sub.items():
            level.rule[k][r] = v
        level.n[r] += 1
        out, below = self.hourglass_step(state, h, bd, pos, rows, given[1:],
                                         None if noise is None else noise[:, 1:])
        return out, [bd.b] + below
