"""MFU never reads above 100%: the peak is the best of several matmul timings or the device's
datasheet peak; an interval that beats a measured peak re-measures it once, and a peak still
beaten (or one given by train.peak_flops) turns MFU into None with a one-time note."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rltok.training import distributed as ddp
from rltok.training import peak as peak_mod
from rltok.training.metrics import TIMING_KEYS, IntervalMeter, Reporter
from rltok.training.peak import UNRELIABLE_NOTE, PeakFlops, known_peak

from conftest import run_cli


@pytest.fixture
def timings(monkeypatch):
    """_time_matmul answers from a list of seconds (the first: the warm-up); the calls are counted."""
    calls = []

    def install(seconds):
        it = iter(seconds)

        def fake(a, b, reps):
            calls.append((tuple(a.shape), tuple(b.shape), a.dtype))
            return next(it)
        monkeypatch.setattr(peak_mod, "_time_matmul", fake)
        monkeypatch.setattr(peak_mod, "_MEASURED", {})
        return calls
    return install


def test_the_peak_is_the_best_of_several_timings(timings):
    calls = timings([9.0, 0.5, 0.2, 0.1, 0.4, 0.3])  # warm-up, then five timings
    flops = peak_mod.best_matmul_flops(torch.device("cpu"), torch.float32, (8, 16, 32), budget_s=0.0, min_timings=5)
    assert len(calls) == 6 and calls[0] == ((8, 16), (16, 32), torch.float32)
    assert flops == pytest.approx(2 * 8 * 16 * 32 / 0.1)  # the fastest timing, not the first or the mean


def test_measured_peak_is_the_best_over_shapes_and_dtypes_and_cached(timings):
    # fp32 square: slow; bf16 square: fast. Five timings each after a warm-up.
    calls = timings([1.0] + [1.0] * 5 + [1.0] + [0.5, 0.25, 0.5, 0.5, 0.5])
    shapes, dev = [(4, 4, 4)], torch.device("cpu")
    best = peak_mod.measured_peak(dev, (torch.float32, torch.bfloat16), shapes, budget_s=0.0)
    assert best == pytest.approx(2 * 64 / 0.25)
    assert {c[2] for c in calls} == {torch.float32, torch.bfloat16}
    n = len(calls)
    assert peak_mod.measured_peak(dev, (torch.float32, torch.bfloat16), shapes, budget_s=0.0) == best
    assert len(calls) == n  # cached: no second timing


def test_fresh_measurement_keeps_the_better_of_old_and_new(timings):
    timings([1.0, 0.1, 0.1, 0.1, 0.1, 0.1] + [1.0, 0.2, 0.2, 0.2, 0.2, 0.2])
    dev = torch.device("cpu")
    first = peak_mod.measured_peak(dev, (torch.float32,), [(4, 4, 4)], budget_s=0.0)
    assert peak_mod.measured_peak(dev, (torch.float32,), [(4, 4, 4)], budget_s=0.0, fresh=True) == first


def test_measured_peak_times_a_matmul_of_the_models_largest_layer(timings):
    calls = timings(itertools.repeat(1.0))  # the start-up budget is real time: as many timings as fit
    model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 16), nn.Linear(8, 8))
    assert peak_mod.model_matmul_shape(model, rows=5000, max_rows=1024) == (1024, 16, 64)
    p = peak_mod.device_peak(torch.device("cpu"), None, model, rows=300)
    assert p.source == "measured" and {c[:2] for c in calls} == {((300, 16), (16, 64)), ((512, 512), (512, 512))}
    assert p.flops == pytest.approx(2 * 512 ** 3)


def test_the_real_measurement_is_positive_and_the_square_matmul_entry_point_uses_it(monkeypatch):
    monkeypatch.setattr(peak_mod, "_MEASURED", {})
    flops = peak_mod.best_matmul_flops(torch.device("cpu"), torch.float32, (64, 64, 64), budget_s=0.0, min_timings=2)
    assert 0 < flops < float("inf")
    assert peak_mod.measured_peak_flops(torch.device("cpu"), None, budget_s=0.0) > 0


@pytest.mark.parametrize("name,dtype,expected", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12),
    ("NVIDIA H200", torch.bfloat16, 989.4e12),
    ("NVIDIA GH200 480GB", torch.bfloat16, 989.4e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.5e12),
    ("NVIDIA H200 NVL", torch.bfloat16, 835.5e12),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
    ("NVIDIA A100 80GB PCIe", None, 19.5e12),
    ("NVIDIA L4", torch.bfloat16, 121e12),
    ("NVIDIA L40S", torch.bfloat16, 366.5e12),
    ("NVIDIA GeForce RTX 4090", torch.bfloat16, 165.2e12),
    ("NVIDIA L40", torch.bfloat16, None),  # not in the table: not mistaken for an L4
    ("Tesla V100-SXM2-16GB", torch.bfloat16, None),
])
def test_a_known_device_name_maps_to_its_datasheet_peak(name, dtype, expected, monkeypatch):
    monkeypatch.setattr(peak_mod, "_tf32_allowed", lambda: False)
    assert known_peak(name, dtype) == expected


def test_fp32_matmuls_allowed_to_use_tf32_get_the_tf32_peak(monkeypatch):
    monkeypatch.setattr(peak_mod, "_tf32_allowed", lambda: True)
    assert known_peak("NVIDIA H100 80GB HBM3", None) == 494.7e12
    assert known_peak("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.4e12


def test_a_known_cuda_device_uses_its_datasheet_peak_without_timing(monkeypatch, timings):
    calls = timings([])
    monkeypatch.setattr(peak_mod, "device_name", lambda device: "NVIDIA H200")
    p = peak_mod.device_peak(torch.device("cuda", 0), torch.bfloat16, nn.Linear(4, 4), rows=8)
    assert (p.flops, p.source, calls) == (989.4e12, "datasheet", [])
    assert "NVIDIA H200 bf16 datasheet" in p.describe()


# ---- the interval that beats its peak -----------------------------------------------------------
class FixedCost:
    """A model cost of exactly `fpb` training FLOPs per byte (whatever the rate)."""

    def __init__(self, fpb: float):
        self.fpb = fpb

    def at(self, seq_len: int):
        return self

    def step_train_per_byte(self, *rates) -> float:
        return self.fpb


def interval(meter: IntervalMeter, step: int, bytes_per_s: float, peak: PeakFlops, seconds: float = 1.0) -> dict:
    """One record of an interval of `seconds` at `bytes_per_s` (the meter's clock set back)."""
    meter.add({"loss": torch.tensor(1.0)})
    meter.t_last -= seconds
    new_bytes = int(bytes_per_s * seconds)
    charged = (meter.flops_last or 0.0) + meter.cost.fpb * new_bytes  # what training charged meanwhile
    return meter.record(step, meter.bytes_last + new_bytes, 1e-3, charged, peak)


@pytest.fixture
def meter():
    m = IntervalMeter(ddp.DistInfo(), torch.device("cpu"), 64, cost=FixedCost(1000.0))
    m.restart_clock(0, 0.0)
    return m


def test_flops_per_second_are_the_flops_the_interval_charged(meter):
    """A counterfactual pass (flips with a model pass) charges more than a plain step and a
    tokenizer-phase step less: the rate is the charged FLOPs' change, not a plain step's price."""
    peak = PeakFlops(1e12, "config")
    meter.add({"loss": torch.tensor(1.0)})
    meter.t_last -= 2.0
    rec = meter.record(1, 1000, 1e-3, 3.0e6, peak)  # 1,000 bytes charged at 3,000 FLOPs each
    assert rec["flops_per_s"] == pytest.approx(1.5e6, rel=1e-3)  # not 1,000 x 1,000 / 2 s
    assert rec["flops_per_s"] / rec["bytes_per_s"] == pytest.approx(3000, rel=1e-3)


def test_an_interval_below_the_peak_logs_its_mfu(meter):
    rec = interval(meter, 1, 1e6, PeakFlops(1e10, "measured", remeasure=lambda: pytest.fail("no re-measure")))
    assert 0 < rec["mfu"] <= 1 and rec["peak_source"] == "measured" and "mfu_note" not in rec


def test_a_beaten_measured_peak_is_measured_once_again_then_mfu_goes_missing_with_one_note(meter):
    remeasured = []

    def remeasure():
        remeasured.append(1)
        return 2e8  # better than the first (1e8) but still below the achieved 1e9

    peak = PeakFlops(1e8, "measured", remeasure=remeasure)
    reporter = Reporter(SimpleNamespace(train=SimpleNamespace(max_steps=3)), quiet=True)
    recs = [interval(meter, s, bytes_per_s, peak) for s, bytes_per_s in [(1, 1e6), (2, 1e6), (3, 1e3)]]
    for rec in recs:
        reporter.show({"loss": 1.0, "bpb": 1.0, **rec})
    assert remeasured == [1] and peak.flops == 2e8  # one re-measure, the better peak kept
    assert [r["mfu"] for r in recs] == [None, None, None]  # never a number above 1; not trusted again
    assert [r["peak_source"] for r in recs] == ["measured"] * 3
    assert reporter.notes == [recs[0]["mfu_note"]] and recs[0]["mfu_note"].startswith(UNRELIABLE_NOTE)
    assert all("mfu_note" not in r for r in recs[1:])
    assert reporter.warnings == 0  # a note, not a warning: the warning count in the records stays


def test_a_re_measure_that_clears_the_interval_keeps_mfu(meter):
    peak = PeakFlops(1e8, "measured", remeasure=lambda: 1e10)
    rec = interval(meter, 1, 1e6, peak, seconds=1000.0)  # a long interval: the test's own time is noise
    assert rec["mfu"] == pytest.approx(1e9 / 1e10, rel=1e-3) and rec["peak_flops"] == 1e10
    assert "mfu_note" not in rec


def test_a_beaten_configured_peak_is_not_re_measured(meter):
    peak = PeakFlops(1.0, "config")
    rec = interval(meter, 1, 1e6, peak)
    assert rec["mfu"] is None and "train.peak_flops" in rec["mfu_note"] and "MFU not shown" in rec["mfu_note"]


def test_mfu_is_never_above_one_whatever_the_numbers():
    for flops, achieved, devices in [(1e9, 1e9, 1), (1e9, 1.0000001e9, 1), (1e9, 3e9, 2), (1e9, 1.5e9, 2)]:
        mfu, _ = PeakFlops(flops, "measured", remeasure=lambda: 0.0).mfu(achieved, devices)
        assert mfu is None or 0 <= mfu <= 1


def test_the_note_and_the_peak_flops_are_timing_keys():
    assert {"mfu", "mfu_note", "peak_flops"} <= set(TIMING_KEYS) and "peak_source" not in TIMING_KEYS


# ---- the first command's path -------------------------------------------------------------------
def test_rltok_train_with_a_tiny_peak_records_no_mfu_but_the_note(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_bytes(b"".join(b"%d the quick brown fox, %x lazy dogs\n" % (i, i * 7) for i in range(400)))
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--preset", "tiny", "--data", data, "--out", out, "--steps", "2",
                           "train.device=cpu", "train.threads=1", "train.log_every=1", "train.eval_every=2",
                           "train.eval_batches=1", "train.batch_size=2", "train.peak_flops=1")
    assert code == 0, err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["mfu"] is None and r["peak_source"] == "config" for r in records)
    assert "mfu_note" in records[0] and "mfu_note" not in records[1]
    assert err.count("MFU not shown") == 1 and "MFU " not in err.replace("MFU not shown", "")


def test_the_trainer_with_a_measured_peak_that_reads_low_records_no_mfu(tmp_path, monkeypatch):
    from rltok.config import load_config
    from rltok.training.trainer import Trainer
    from test_tracking import corpus

    measured = []

    def busy_machine(device, dtypes, shapes, budget_s, fresh=False):
        measured.append(fresh)
        return 1.0  # every timing ran while something else had the cores

    monkeypatch.setattr(peak_mod, "measured_peak", busy_machine)
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=3", "train.device=cpu",
                                         "train.threads=1", "train.log_every=1", "train.eval_every=3",
                                         "train.eval_batches=1", "train.checkpoint_every=1000"])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    history = trainer.fit().history
    assert measured == [False, True]  # measured at start-up, once more when the first interval beat it
    assert [r["mfu"] for r in history] == [None] * 3 and history[0]["peak_source"] == "measured"
    assert trainer.report.notes == [history[0]["mfu_note"]] and UNRELIABLE_NOTE in history[0]["mfu_note"]
