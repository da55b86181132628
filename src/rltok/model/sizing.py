"""A size ladder per model family from one knob, non-embedding parameters N -> a model config, by the
shape rule of docs/SCALING.md, "The size ladder"; N is asked of the built model (meta device)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

from rltok.config import load_config

HEAD_DIM = 16  # every width from 32 up is a multiple of it; heads = width / HEAD_DIM
NARROW_WIDTHS = (8, 16, 24)  # below 32: heads of NARROW_HEAD_DIM where HEAD_DIM does not divide
NARROW_HEAD_DIM = 8
ASPECT = 32  # the width / depth every shape aims at
TOLERANCE = 0.15  # shapes within this share of the target N compete on their aspect ratio
DEFAULT_BPE_VOCAB = 2048  # the BPE-token model's vocabulary where the base overrides set none
MAX_WIDTH = 1024  # the widest shape tried
MAX_DEPTH = 48  # the deepest


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def heads(width: int) -> int:
    """Attention heads of a stack `width` wide: width / 16, or width / 8 where 16 does not divide it."""
    return width // (HEAD_DIM if width % HEAD_DIM == 0 else NARROW_HEAD_DIM)


def widths() -> list[int]:
    """Every width the ladder tries, narrowest first."""
    return [*NARROW_WIDTHS, *range(2 * HEAD_DIM, MAX_WIDTH + 1, HEAD_DIM)]


class FlatShape:
    """The flat byte transformer: d_chunk x flat_layers."""

    arch = "flat"

    def fixed(self, model_cfg) -> list[str]:
        """The overrides every size of the family shares."""
        return [f"model.arch={self.arch}"]

    def knobs(self, depth: int) -> dict[str, int]:
        """The layer counts at `depth` (each knob a set of identical blocks)."""
        return {"flat_layers": depth}

    def overrides(self, width: int, knobs: dict[str, int]) -> list[str]:
        return [f"model.d_chunk={width}", f"model.n_heads_chunk={heads(width)}",
                *(f"model.{k}={v}" for k, v in knobs.items())]


class TokenShape(FlatShape):
    """The BPE-token transformer: the flat shape over tokens, with a vocabulary."""

    arch = "bpe_token"

    def fixed(self, model_cfg) -> list[str]:
        vocab = [] if model_cfg.bpe_vocab else [f"model.bpe_vocab={DEFAULT_BPE_VOCAB}"]
        return [*super().fixed(model_cfg), *vocab]


def check_shape_knobs(aspect: float = ASPECT, byte_ratio: float = 0.5) -> None:
    """ValueError unless the shape rule's knobs make sense: width / depth `aspect` > 0, the
    hierarchy's byte width over its chunk width `byte_ratio` in (0, 1]."""
    if not 0 < aspect < math.inf:
        raise ValueError(f"aspect (width / depth) must be > 0, got {aspect}")
    if not 0 < byte_ratio <= 1:
        raise ValueError(f"byte_ratio (the byte level's width over the chunk level's) must be in (0, 1], "
                         f"got {byte_ratio}")


class HierarchyShape(FlatShape):
    """The hourglass: the chunk level at the width, the byte level at `byte_ratio` of it (half by
    default); `depth` is the main network's, the byte level has a third of it on each side (at
    least one layer)."""

    arch = "hourglass"

    def __init__(self, byte_ratio: float = 0.5):
        check_shape_knobs(byte_ratio=byte_ratio)
        self.byte_ratio = byte_ratio

    def knobs(self, depth: int) -> dict[str, int]:
        return {"main_layers": depth, "byte_layers": max(1, round_half_up(depth / 3))}

    def overrides(self, width: int, knobs: dict[str, int]) -> list[str]:
        d_byte = width if width < HEAD_DIM else max(
            HEAD_DIM, HEAD_DIM * round_half_up(width * self.byte_ratio / HEAD_DIM))
        side = knobs["byte_layers"]
        return [*super().overrides(width, {"main_layers": knobs["main_layers"]}), f"model.d_byte={d_byte}",
                f"model.n_heads_byte={heads(d_byte)}", f"model.encoder_layers={side}", f"model.decoder_layers={side}"]


SHAPES: dict[str, FlatShape] = {s.arch: s for s in (FlatShape(), TokenShape(), HierarchyShape())}


class Rung(NamedTuple):
    """One size of a ladder: the N asked for, the N its built model has, and the overrides
    (family and shape keys) that build it."""

    target: float
    achieved: int
    overrides: list[str]


class Candidate(NamedTuple):
    width: int
    depth: int
    n: int  # non-embedding parameters (the built models' counts, affine in each layer count)


def built_model(overrides: Sequence[str], preset: str = "tiny"):
    """The model `load_config(preset, overrides)` builds, on the meta device."""
    from rltok.model.factory import planned_model

    return planned_model(load_config(preset, overrides=list(overrides)).model)


@functools.lru_cache(maxsize=4096)
def _non_embedding_params(overrides: tuple[str, ...], preset: str) -> int:
    # a study builds the same ladders for every budget, corpus and dry run: each shape once
    return built_model(overrides, preset).non_embedding_params()


class Family:
    """A family's shapes on top of base overrides. Each width's N is asked of models built with one
    layer per knob and with one more of each: N is affine in each layer count, so every depth
    follows without a build. `byte_ratio` (the hierarchy only) sets its byte level's width."""

    def __init__(self, family: str, base_overrides: Sequence[str] = (), preset: str = "tiny",
                 byte_ratio: float | None = None):
        if family not in SHAPES:
            raise ValueError(f"unknown family {family!r}; choose from {', '.join(SHAPES)}")
        if byte_ratio is not None and family != HierarchyShape.arch:
            raise ValueError(f"byte_ratio sets the hierarchy's byte level: {family!r} has none")
        self.shape = SHAPES[family] if byte_ratio is None else HierarchyShape(byte_ratio)
        self.base, self.preset = list(base_overrides), preset
        self.fixed = self.shape.fixed(load_config(preset, overrides=self.base).model)

    def overrides(self, width: int, depth: int) -> list[str]:
        return [*self.fixed, *self.shape.overrides(width, self.shape.knobs(depth))]

    def params(self, overrides: Sequence[str]) -> int:
        return _non_embedding_params((*self.base, *overrides), self.preset)

    def _width(self, width: int) -> list[Candidate]:
        ones = {k: 1 for k in self.shape.knobs(1)}
        n1 = self.params([*self.fixed, *self.shape.overrides(width, ones)])
        per_layer = {k: self.params([*self.fixed, *self.shape.overrides(width, {**ones, k: 2})]) - n1 for k in ones}
        depths = [(depth, self.shape.knobs(depth)) for depth in range(1, MAX_DEPTH + 1)]
        return [Candidate(width, depth, n1 + sum((knobs[k] - 1) * per_layer[k] for k in ones))
                for depth, knobs in depths]

    def candidates(self, largest: float = math.inf) -> list[Candidate]:
        """Every (width, depth) up to MAX_WIDTH x MAX_DEPTH, widening only until one layer
        alone holds more than twice `largest` N (wider shapes are all further from any target)."""
        out = []
        for width in widths():
            shapes = self._width(width)
            out += shapes
            if shapes[0].n > 2 * largest:
                break
        return out


def choose(candidates: Sequence[Candidate], target: float, aspect: float = ASPECT) -> Candidate:
    """The shape for `target` N: within TOLERANCE of it, the width/depth nearest `aspect` (then the
    nearer N); where none is that close, the nearest N."""
    def miss(c: Candidate) -> float:
        return abs(math.log(c.n / target))

    near = [c for c in candidates if miss(c) <= math.log1p(TOLERANCE)]
    if not near:
        return min(candidates, key=miss)
    return min(near, key=lambda c: (abs(math.log(c.width / c.depth / aspect)), miss(c)))


def ladder(family: str, sizes: Sequence[float], base_overrides: Sequence[str] = (),
           preset: str = "tiny", aspect: float = ASPECT, byte_ratio: float | None = None) -> list[Rung]:
    """For each target N in `sizes`, the shape of `family` ("flat", "bpe_token", "hourglass") that
    `choose` picks on top of `base_overrides`; a rung's `overrides` are the family and shape keys
    only: load_config(preset, [*base_overrides, *overrides]) builds it."""
    if any(target <= 0 for target in sizes):
        raise ValueError(f"model sizes must be > 0, got {list(sizes)}")
    check_shape_knobs(aspect=aspect)
    fam = Family(family, base_overrides, preset, byte_ratio)
    options = fam.candidates(max(sizes, default=0))
    rungs = []
    for target in sizes:
        best = choose(options, target, aspect)
        overrides = fam.overrides(best.width, best.depth)
        rungs.append(Rung(target, fam.params(overrides), overrides))
    return rungs


def geometric_sizes(n_min: float, n_max: float, points: int) -> list[int]:
    """`points` sizes from n_min to n_max, evenly spaced in log N (rounded to integers)."""
    if points < 1 or n_min <= 0 or n_max < n_min:
        raise ValueError("geometric_sizes needs points >= 1 and 0 < n_min <= n_max")
    if points == 1:
        return [round(n_min)]
    step = (n_max / n_min) ** (1.0 / (points - 1))
    return [round(n_min * step ** i) for i in range(points)]


def method_spec(name: str, overrides: Sequence[str]) -> str:
    """An `rltok compare` method running `name` at a rung's shape: `NAME@k=v,k=v`."""
    if any("," in o for o in overrides):
        raise ValueError("an override holding a comma cannot be written into a method spec")
    return f"{name}@{','.join(overrides)}"
