"""Windows of a byte stream: random training windows and the fixed evaluation windows."""
from __future__ import annotations


import numpy as np
import torch

from rltok.data.sources import DataError

def _xy(data, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, long tensors, of the `length`-byte window at each start. A byte
    stream reads just these windows from disk."""
    if isinstance(data, torch.Tensor):
        win = data[starts.unsqueeze(1) + torch.arange(length)].long()
    else:
        win = torch.from_numpy(data.gather(starts.numpy(), length)).long()
    return win[:, :-1], win[:, 1:]


class WindowSampler:
    """Random (x, y) windows of seq_len+1 bytes; its RNG state is the data position. With
    `world_size` N every rank draws the starts of the whole global batch from the same generator
    and reads only its own block of rows (the batch one process with batch_size * N would see).
    `data` is a uint8 tensor or a byte stream; a mixture of sources draws its own starts."""

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(data) < 2:
            raise DataError("need at least 2 bytes of training data")
        self.data = data
        self.batch_size = batch_size  # per rank
        self.seq_len = min(seq_len, getattr(data, "window_limit", len(data)) - 1)
        self.rank, self.world_size = rank, world_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch_size * self.world_size
        if hasattr(self.data, "draw_starts"):
            starts = self.data.draw_starts(self.gen, n, self.seq_len + 1)
        else:
            starts = torch.randint(0, len(self.data) - self.seq_len, (n,), generator=self.gen)
        lo = self.rank * self.batch_size
        return _xy(self.data, starts[lo:lo + self.batch_size], self.seq_len + 1)

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


def _eval_starts(n: int, seq_len: int, max_windows: int, context: int = 1) -> tuple[torch.Tensor, int]:
    if n < 2:
        raise DataError("evaluation data needs at least 2 bytes")
    seq_len = min(seq_len, n - 1)
    if not 1 <= context <= seq_len:
        raise DataError(f"evaluation context must be 1..{seq_len} (the window's bytes before the last), got {context}")
    # windows of seq_len + 1 bytes overlapping by `context`: each byte after the first `context`
    # is scored once (context 1: the non-overlapping tiling, the last byte of one the first of the next)
    stride = seq_len + 1 - context
    n_all = (n - 1 - seq_len) // stride + 1
    idx = np.arange(n_all)
    if max_windows and n_all > max_windows:
        idx = np.linspace(0, n_all - 1, max_windows).round().astype(np.int64)
    return torch.from_numpy(idx * stride), seq_len


class EvalWindows:
    """The windows of `eval_windows`, read from `data` only when asked for: a batch at a time
    holds one batch's windows (8 bytes per position as long tensors), not the whole split's."""

    def __init__(self, data, seq_len: int, max_windows: int = 0, context: int = 1):
        self.data = data
        self.starts, self.seq_len = _eval_starts(len(data), seq_len, max_windows, context)

    def __len__(self) -> int:
        return len(self.starts)

    def take(self, lo: int = 0, hi: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of windows lo..hi, (n, T) long tensors."""
        return _xy(self.data, self.starts[lo:hi], self.seq_len + 1)

    def batches(self, batch_size: int):
        """(x, y) of `batch_size` windows at a time, in order."""
        for i in range(0, len(self), batch_size):
            yield self.take(i, i + batch_size)


def eval_windows(data: torch.Tensor, seq_len: int, max_windows: int = 0,
                 context: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) windows (N, T) tiling `data` in order (with `max_windows`, an evenly spaced subset),
    overlapping by `context` bytes, so that evaluate(context=) scores every byte once; `EvalWindows`
    gives the same windows a batch at a time."""
    return EvalWindows(data, seq_len, max_windows, context).take()


def rank_eval_windows(data: torch.Tensor, seq_len: int, max_windows: int, rank: int = 0,
                      world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A data-parallel rank's share of `eval_windows(data, seq_len, max_windows)`: equal consecutive
    blocks (a remainder left out); with fewer windows than ranks every rank takes all of them and
    `shared` (the third value) says so."""
    windows = EvalWindows(data, seq_len, max_windows)
    shared = len(windows) < world_size
    n = len(windows) // world_size
    x, y = windows.take() if shared else windows.take(rank * n, (rank + 1) * n)
    return x, y, shared
