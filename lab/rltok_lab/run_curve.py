"""A run's validation curve as its study record keeps it (`curve`: step, bytes, training FLOPs and
val bpb at each evaluation), read at a share of the run's training FLOPs, so that two runs of one
budget are compared at the same point of their runs whatever their step counts."""

from __future__ import annotations

SHARES = (1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0)  # the study's runs evaluate at every sixth of their FLOPs


def curve_at(rec: dict, share: float) -> float | None:
    """The run's validation bpb at `share` of its training FLOPs, linear between the evaluations on
    either side of it (however far apart), the nearest end's value within 0.02 beyond the first or
    the last; None further out (no guess beyond the curve) or without a curve."""
    pts = sorted((c["train_flops"] / rec["budget_flops"], c["val_bpb"]) for c in rec.get("curve") or []
                 if c.get("val_bpb") is not None)
    if not pts or not pts[0][0] - 0.02 <= share <= pts[-1][0] + 0.02:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= share <= x1:
            return y0 + (y1 - y0) * (share - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[0][1] if share < pts[0][0] else pts[-1][1]
