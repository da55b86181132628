"""Returns, advantages and baselines for any sequence of decisions, on (..., T) tensors on the device,
with no per-step host round trip."""

from __future__ import annotations

import torch

_BLOCK = 64


def discounted_cumsum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """y_t = sum_{k >= t} gamma^(k-t) x_k along the last dimension: a blocked scan (a triangular matmul
    in blocks of 64, recursing on the block sums), with no loop over time and no gamma^T to underflow.
    In fp32 even under autocast: a bf16 matmul would be off by a quarter nat on returns of ~40."""
    with torch.autocast(x.device.type, enabled=False):
        return _discounted_cumsum(x, gamma)


def _discounted_cumsum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    length = x.shape[-1]
    if gamma == 0.0 or length == 0:
        return x.clone()
    lead = x.shape[:-1]
    block = min(_BLOCK, length)
    n_blocks = -(-length // block)
    pad = n_blocks * block - length
    xf = torch.nn.functional.pad(x.float(), (0, pad)).reshape(*lead, n_blocks, block)
    i = torch.arange(block, device=x.device)
    expo = (i.unsqueeze(0) - i.unsqueeze(1)).to(torch.float64)  # [t, k] = k - t
    tri = torch.where(expo >= 0, torch.tensor(gamma, dtype=torch.float64, device=x.device) ** expo.clamp(min=0),
                      torch.zeros((), dtype=torch.float64, device=x.device)).float()
    local = xf @ tri.T  # local[..., n, t] = sum_{k >= t in block n} gamma^(k-t) x_k
    if n_blocks > 1:
        # discounted sums of everything from block n+1 onwards, seen from the start of block n+1
        starts = _discounted_cumsum(local[..., 0], gamma ** block)
        carry = torch.nn.functional.pad(starts[..., 1:], (0, 1))
        decay = torch.tensor(gamma, dtype=torch.float64, device=x.device) ** (block - i).to(torch.float64)
        local = local + carry.unsqueeze(-1) * decay.float()
    out = local.reshape(*lead, n_blocks * block)[..., :length]
    return out.to(x.dtype)


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimation: A_t = sum_k (gamma*lam)^(k-t) delta_k with
    delta_t = r_t + gamma V_{t+1} - V_t (V after the last step = 0)."""
    next_values = torch.nn.functional.pad(values[..., 1:], (0, 1))
    delta = rewards + gamma * next_values - values
    return discounted_cumsum(delta, gamma * lam)


def batch_relative(r: torch.Tensor, leave_one_out: bool = False, mean=None, rows: int | None = None) -> torch.Tensor:
    """Subtract the per-position mean over the batch (dim 0). With leave_one_out, each row's
    baseline excludes itself, which keeps the estimator unbiased. `mean` may replace the local
    batch mean, and `rows` the local row count it is over (e.g. a mean all-reduced across
    data-parallel ranks, over all their rows)."""
    n = r.shape[0] if rows is None else rows
    mu = r.mean(0, keepdim=True) if mean is None else mean
    if not leave_one_out:
        return r - mu
    if n < 2:
        raise ValueError("a leave-one-out baseline needs at least 2 rows in the batch (there are no others)")
    return (r - mu) * (n / (n - 1))


def group_relative(r: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out baseline within groups of `group_size` consecutive rows (K samples of the
    same sequence, GRPO style)."""
    if r.shape[0] % group_size:
        raise ValueError(f"batch of {r.shape[0]} is not a multiple of group_size={group_size}")
    if group_size < 2:
        raise ValueError("a group-relative baseline needs group_size >= 2")
    g = r.reshape(-1, group_size, *r.shape[1:])
    return ((g - g.mean(1, keepdim=True)) * (group_size / (group_size - 1))).reshape(r.shape)
