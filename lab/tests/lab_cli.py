"""The lab's tests call commands the way the study's notebooks wrote them before the lab moved out
of the library: `rltok scaling --status/--predict/--holdout/--check-optimum`, `rltok diagnose`
(with --true-advantage/--lexicon-costs too) and `rltok vocab` are routed to `python -m rltok_lab`;
every other command is rltok's own."""

from rltok.cli import main as rltok_main
from rltok_lab.cli import main as lab_main

STUDY_STEPS = {"--status", "--predict", "--holdout", "--check-optimum", "--at", "--family", "--variant", "--lr-mults"}
INSTRUMENTS = {"--true-advantage": "true-advantage", "--lexicon-costs": "lexicon-costs"}


def main(argv: list[str]) -> int:
    argv = list(argv)
    if argv[:1] == ["scaling"] and STUDY_STEPS & set(argv):
        return lab_main(["study", *argv[1:]])
    if argv[:1] == ["diagnose"]:
        for flag, command in INSTRUMENTS.items():
            if flag in argv:
                return lab_main([command, *(a for a in argv[1:] if a != flag)])
    if argv[:1] in (["diagnose"], ["vocab"]):
        return lab_main(argv)
    return rltok_main(argv)
