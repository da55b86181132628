"""Stopping on a signal: the handler asks for a stop (under data parallelism it only notes the
signal, and the ranks agree in the next step), a second SIGINT aborts, the previous handlers
come back; `trainer.stop_requested` tells a script that the run was interrupted."""

from __future__ import annotations

import os
import signal

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
