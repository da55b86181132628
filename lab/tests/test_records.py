"""The packed results (rltok_lab.records): files come back byte for byte, the schema names what is
wrong and where, every committed record fits it, and a report regenerated from the records is the
committed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rltok_lab import records

REPO = Path(__file__).resolve().parents[2]  # the repository


def _sample_tree(root: Path) -> dict[str, str]:
    """A small results tree as the writers leave it: {path under root: text}."""
    run = records.load("scaling", "docs-en", "C*__*__N*__s*.json")[0]
    compare = records.load("compare", "code-py", "rl_s0.json")[0]
    texts = {
        "scaling/docs-en/C1e11__flat__N100__s0.json": json.dumps(run, indent=2),  # rltok scaling's writer
        "scaling/code-py/C1e11__flat__N100__s1.json": json.dumps({**run, "bpb": None, "diverged": "nan"}, indent=2),
        "compare/b1000000/code-py/rl_s0.json": json.dumps(compare, indent=2),
        "boundary/code-py/token_rules.json": json.dumps({"rules": {"x": 0.25}}, indent=1) + "\n",
        "boundary/docs-en/odd.json": '{"a": 1,\n "b": [1.50, 2]}',  # no json.dumps setting writes this
        "scaling/prediction.json": json.dumps({"at": 3e12}, indent=2),  # stays a plain file
        "core_code-py.json": json.dumps({"corpus": "code-py", "bpb": 2.0}, indent=2) + "\n",
    }
    for rel, text in texts.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return texts


def test_pack_unpack_round_trip_is_byte_identical(tmp_path):
    root, dest = tmp_path / "results", tmp_path / "unpacked"
    texts = _sample_tree(root)
    written = records.pack_all(root, remove=True)
    names = sorted(p.relative_to(root).as_posix().removesuffix(".gz") for p in written)
    assert names == ["boundary/code-py.jsonl", "boundary/docs-en.jsonl", "compare/code-py.jsonl",
                     "core.jsonl", "scaling/code-py.jsonl", "scaling/docs-en.jsonl"]
    for p in written:  # compressed exactly when large
        size = sum(len(json.dumps(line)) for line in records.read_lines(p))
        assert p.name.endswith(".gz") == (size > records.GZIP_ABOVE), p
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json")) == ["scaling/prediction.json"]
    lines = records.read_lines(root / "boundary" / "docs-en.jsonl")
    assert lines == [{"file": "docs-en/odd.json", "record": {"a": 1, "b": [1.5, 2]}, "text": texts["boundary/docs-en/odd.json"]}]
    records.unpack_all(dest, root)
    got = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert got == {rel: text.encode() for rel, text in texts.items()}
    # packing again (a new run beside the packed ones) keeps the old lines; the same records, the same bytes
    before = {p: p.read_bytes() for p in written}
    records.pack_all(root)
    assert {p: p.read_bytes() for p in written} == before
    (root / "scaling" / "docs-en").mkdir()
    (root / "scaling" / "docs-en" / "C1e11__flat__N100__s2.json").write_text(texts["scaling/docs-en/C1e11__flat__N100__s0.json"])
    records.pack(root / "scaling", remove=True)
    assert [e[0] for e in records.entries("scaling", "docs-en", root)] == [
        "docs-en/C1e11__flat__N100__s0.json", "docs-en/C1e11__flat__N100__s2.json"]
    assert len(records.read_lines(next((root / "scaling").glob("docs-en.jsonl*")))) == 2


def test_schema_names_the_file_and_the_key():
    run = records.load("scaling", "code-py", "C*__*__N*__s*.json")[0]
    name = "docs-en/C1e11__flat__N100__s0.json"
    records.validate(run, name)
    records.validate({**run, "bpb": None}, name)  # a diverged run has no bpb
    missing = {k: v for k, v in run.items() if k != "budget_flops"}
    with pytest.raises(records.RecordError, match=r"C1e11__flat__N100__s0\.json.*'budget_flops'"):
        records.validate(missing, name)
    with pytest.raises(records.RecordError, match=r"C1e11__flat__N100__s0\.json.*'seed'.*integer"):
        records.validate({**run, "seed": "0"}, name)
    with pytest.raises(records.RecordError, match=r"rl_s0\.json.*'method'"):
        records.validate({"seed": 0}, "code-py/rl_s0.json", study="compare")
    with pytest.raises(records.RecordError, match="C1e11__flat__N100__s0.json"):
        records.validate(["not", "an", "object"], name)


def test_a_bad_record_is_refused_when_packed(tmp_path):
    bad = tmp_path / "scaling" / "docs-en" / "C1e11__flat__N100__s0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"family": "flat"}, indent=2))
    with pytest.raises(records.RecordError, match="C1e11__flat__N100__s0.json.*lacks key"):
        records.pack(tmp_path / "scaling")
    assert not list((tmp_path / "scaling").glob("*.jsonl*"))


def test_every_committed_record_fits_its_schema():
    assert records.records_files(), "no packed records under lab/results"
    assert records.check() == []
    # and nothing in lab/results is a per-run JSON file that should have been packed
    loose = [p for p in records.RESULTS.rglob("*.json") if not records.is_kept_plain(p) and not records.is_output(p)]
    tracked = set(subprocess.run(["git", "ls-files", "lab/results"], cwd=REPO, capture_output=True, text=True).stdout.split())
    assert not [p for p in loose if p.relative_to(REPO).as_posix() in tracked]


def test_regenerating_a_report_reproduces_the_committed_one(tmp_path):
    """RESULTS.md from the core records (the fastest report): `--check` exits 0 only when the
    regenerated text is the committed one up to its provenance (commands and commit hashes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "lab")])}
    proc = subprocess.run([sys.executable, "-m", "rltok_lab.regenerate", "--only", "core", "--check",
                           "--work", str(tmp_path / "work")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "1 outputs as tracked" in proc.stderr
    md = (tmp_path / "work" / "docs" / "RESULTS.md").read_text()
    assert md.startswith("# Results") and "| code-py |" in md


def test_provenance_is_all_the_comparison_leaves_out():
    from rltok_lab.regenerate import provenance_free

    a = "Generated by `python lab/scripts/x.py --out lab/results/s` at commit `ad39416`.\n| a | 1.0 |"
    b = "Generated by `python lab/scripts/x.py --out lab/.work/results/s` at commit `29163f2+dirty`.\n| a | 1.0 |"
    assert provenance_free(a) == provenance_free(b)
    assert provenance_free(a) != provenance_free(a.replace("1.0", "1.1"))


def test_unpacking_over_a_live_folder_leaves_equal_files_alone_and_replaces_the_others(tmp_path):
    import os

    root, dest = tmp_path / "results", tmp_path / "live"
    texts = _sample_tree(root)
    records.pack_all(root, remove=True)
    records.unpack_all(dest, root)
    same = dest / "scaling" / "docs-en" / "C1e11__flat__N100__s0.json"
    os.utime(same, (1, 1))  # an old time: a rewrite would move it
    changed = dest / "boundary" / "docs-en" / "odd.json"
    changed.write_text("{}")
    records.unpack_all(dest, root)
    assert same.stat().st_mtime == 1 and changed.read_text() == texts["boundary/docs-en/odd.json"]
