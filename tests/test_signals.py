"""Stopping on a signal: the handler asks for a stop (under data parallelism it only notes the
signal, and the ranks agree in the next step), a second SIGINT or SIGTERM aborts, the previous
handlers come back; `trainer.stop_requested` tells a script that the run was interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from rltok.config import load_config
from rltok.data.sources import Corpus
from rltok.training.signals import StopRequest
from rltok.training.trainer import Trainer


@pytest.mark.parametrize("across_ranks", [False, True])
def test_stop_request_handles_and_restores(across_ranks):
    messages = []
    stop = StopRequest(messages.append, across_ranks=across_ranks)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received and stop.requested is not across_ranks
        assert messages == ["received SIGTERM: finishing the step and checkpointing"]
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C does not wait for the step
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    again = StopRequest(messages.append)
    with again.installed():
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # nor does a second SIGTERM (a job scheduler's)
            os.kill(os.getpid(), signal.SIGTERM)


def test_trainer_stop_requested_after_a_signal(tmp_path):
    text = b"".join(b"%d some words and spaces\n" % i for i in range(300))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    corpus = Corpus(train=data[:6000].clone(), val=data[6000:].clone(), source="synthetic")

    def trainer(out):
        cfg = load_config("test", overrides=[f"train.out_dir={out}", "train.max_steps=6", "train.device=cpu",
                                             "train.threads=1", "train.eval_batches=1", "train.peak_flops=1e12"])
        return Trainer(cfg, corpus=corpus, quiet=True)

    done = trainer(tmp_path / "done")
    assert done.fit().step == 6 and not done.stop_requested
    stopped = trainer(tmp_path / "stopped")
    real_step = stopped.train_step

    def step_then_signal():
        if stopped.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step()

    stopped.train_step = step_then_signal
    assert stopped.fit().step == 3 and stopped.stop_requested


def test_a_second_sigterm_stops_a_step_of_a_million_micro_batches(tmp_path):
    """train.grad_accum=1048576: the step the first signal lets finish would take hours; the second
    ends the run at once the way an interrupt does, the last checkpoint kept for --resume."""
    from rltok.cli import main
    from rltok.training.checkpoint import list_checkpoints
    from rltok.training.loading import load_checkpoint

    data = tmp_path / "data.txt"
    data.write_bytes(b"".join(b"%d some words and spaces, %x more\n" % (i, i * 7) for i in range(600)))
    run = tmp_path / "run"
    fast = ["train.device=cpu", "train.threads=1", "train.eval_every=1000", "train.eval_batches=1"]
    assert main(["train", "--preset", "test", "--data", str(data), "--out", str(run), "--steps", "1", *fast]) == 0
    lines: list[str] = []

    def wait_for(text: str) -> None:
        deadline = time.time() + 120
        while not any(text in line for line in lines) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert any(text in line for line in lines), "".join(lines)

    with subprocess.Popen([sys.executable, "-m", "rltok.cli", "train", "--resume", "--out", str(run), "--steps", "2",
                           "--allow-config-change", "train.grad_accum=1048576", *fast],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        try:
            wait_for("rltok: ")  # the trainer's first line, just before its loop
            time.sleep(1.0)  # inside the step by now
            proc.send_signal(signal.SIGTERM)
            wait_for("received SIGTERM")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            reader.join(10)
    err = "".join(lines)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted before a checkpoint of this step was written" in err
    assert "continues from step 1" in err
    assert [c.name for c in list_checkpoints(run)] == ["step_0000001"]
    load_checkpoint(run)  # the last good checkpoint, whole
