"""The studies' per-run records, packed: one JSON-lines file per study and corpus instead of one
JSON file per run.

Layout under the results root (lab/results):

- `<study>/<corpus>.jsonl.gz` (or `.jsonl` when small): the JSON files of `<study>/` whose path names
  the corpus (a folder `code-py/`, or a name starting `code-py__`); `<study>/records.jsonl[.gz]` the
  study's other JSON files;
- `<name>.jsonl[.gz]`: the loose JSON files of the root itself (`core_code-py.json` ->
  `core.jsonl`, grouped by the name's first word).

Each line is {"file": path relative to the study folder (or the root), "record": the parsed JSON},
plus "indent"/"newline" where the writer's `json.dumps` settings differ from the common ones
(indent 2, no final newline), or "text" (the raw text) where no setting reproduces the file; so
`unpack` recreates every file byte for byte. Files named prediction*.json (the predictions and their
scores) are never packed: a prediction is committed before its runs, and that commit is its evidence.

    python -m rltok_lab.records pack [--root lab/results] [--from lab/.work/results] [--remove]
    python -m rltok_lab.records unpack DEST [--root lab/results]
    python -m rltok_lab.records check [--root lab/results]
    python -m rltok_lab.records extract compare/code-py/rl_s0.json runs/ablation/code-py
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import io
import json
import math
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
RESULTS = ROOT / "lab" / "results"
CORPORA = ("code-py", "docs-en")
OTHER = "records"  # the records file of a study's JSON that names no corpus
GZIP_ABOVE = 8 * 1024  # bytes of JSON lines; smaller files stay plain text, readable in a diff
SUFFIXES = (".jsonl.gz", ".jsonl")


class RecordError(ValueError):
    """A record that does not fit its kind's schema (the message names its file and key)."""


# ------------------------------------------------------------------ what is packed where

def is_kept_plain(path: Path) -> bool:
    """Predictions (and their scores beside them) stay plain files, byte for byte: a prediction's
    commit predates its runs."""
    return path.name.startswith("prediction")


def corpus_of(rel: str) -> str | None:
    """The corpus a file's path (relative to its study folder) names, if any."""
    parts = rel.split("/")
    for part in parts[:-1]:
        if part in CORPORA:
            return part
    for c in CORPORA:
        if parts[-1].startswith(c + "_"):  # vocab/code-py__rl_s0.json
            return c
    return None


def loose_group(name: str) -> str:
    """The records file of a loose JSON file of the root: its name's first word."""
    return name.split("_", 1)[0].removesuffix(".json")


def records_path(folder: Path, group: str, nbytes: int) -> Path:
    return folder / (group + (".jsonl.gz" if nbytes > GZIP_ABOVE else ".jsonl"))


def records_files(root: Path = RESULTS) -> list[Path]:
    """Every records file under `root` (the root's own and its study folders')."""
    root = Path(root)
    found = [p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)]
    return sorted(found)


def study_folder(records_file: Path) -> Path:
    """The folder a records file's paths are relative to: the study folder it lies in, or the root."""
    return Path(records_file).parent


# ------------------------------------------------------------------ exact text

def _candidates(obj) -> list[tuple[dict, str]]:
    return [({"indent": i, "newline": n}, json.dumps(obj, indent=i) + ("\n" if n else ""))
            for i in (2, 1) for n in (False, True)]


def entry(rel: str, text: str) -> dict:
    """A records line for the file `rel` whose text is `text`: the parsed JSON and, where needed, how
    its text was written (or the text itself when no setting reproduces it)."""
    obj = json.loads(text)
    line = {"file": rel, "record": obj}
    for how, dumped in _candidates(obj):
        if dumped == text:
            if how["indent"] != 2:
                line["indent"] = how["indent"]
            if how["newline"]:
                line["newline"] = True
            return line
    line["text"] = text
    return line


def text_of(line: dict) -> str:
    """The file's text exactly as it was packed."""
    if "text" in line:
        return line["text"]
    return json.dumps(line["record"], indent=line.get("indent", 2)) + ("\n" if line.get("newline") else "")


# ------------------------------------------------------------------ reading and writing

def read_lines(records_file: Path) -> list[dict]:
    records_file = Path(records_file)
    raw = gzip.decompress(records_file.read_bytes()) if records_file.name.endswith(".gz") else records_file.read_bytes()
    return [json.loads(s) for s in raw.decode("utf-8").splitlines() if s.strip()]


def write_lines(records_file: Path, lines: list[dict]) -> None:
    data = "".join(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
    if records_file.name.endswith(".gz"):
        buf = io.BytesIO()
        # mtime 0 and no name: the same records give the same bytes, so a repack shows no diff
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(data)
        data = buf.getvalue()
    records_file.write_bytes(data)


def _write_group(folder: Path, group: str, lines: list[dict]) -> Path:
    lines = sorted(lines, key=lambda line: line["file"])
    size = sum(len(json.dumps(line)) for line in lines)
    target = records_path(folder, group, size)
    for suffix in SUFFIXES:  # a group that crossed the size line leaves no stale twin
        twin = folder / (group + suffix)
        if twin != target and twin.exists():
            twin.unlink()
    write_lines(target, lines)
    return target


def _pack_files(source: Path, files: list[Path], into: Path, group_of, study: str | None,
                remove: bool) -> list[Path]:
    """Write the records files of `into` from the JSON `files` under `source`: the lines packed
    there before, each replaced by its file where that exists, and the files new to it."""
    old = [line for rf in sorted(into.iterdir()) if rf.is_file() and rf.name.endswith(SUFFIXES)
           for line in read_lines(rf)] if into.is_dir() else []
    lines = {line["file"]: line for line in old if not is_kept_plain(Path(line["file"]))}
    for p in files:
        rel = p.relative_to(source).as_posix()
        text = p.read_text(encoding="utf-8")
        line = entry(rel, text)
        if text_of(line) != text:  # a file that would not come back as it was is an error, not a silent change
            raise RecordError(f"{p}: does not round-trip")
        lines[rel] = line
    for rel, line in lines.items():
        validate(line["record"], rel, study=study)
    groups: dict[str, list[dict]] = {}
    for rel, line in lines.items():
        groups.setdefault(group_of(rel), []).append(line)
    into.mkdir(parents=True, exist_ok=True)
    written = [_write_group(into, g, ls) for g, ls in sorted(groups.items())]
    if remove:
        for p in files:
            p.unlink()
    return written


def is_output(path: Path) -> bool:
    """A fit that `rltok scaling --fit-only` rewrites beside its report.md: regenerated, not packed."""
    return path.name == "fits.json" and (path.parent / "report.md").exists()


def packable(folder: Path) -> list[Path]:
    return [p for p in sorted(Path(folder).rglob("*.json")) if not is_kept_plain(p) and not is_output(p)]


def pack(folder: Path, remove: bool = False, into: Path | None = None) -> list[Path]:
    """Pack the JSON files of a study folder (all depths; predictions and fits excepted) into its
    records files, one per corpus (in `into`, default the folder itself: a study run in an unpacked
    copy packs back into lab/results); the records files written. Lines packed there before stay,
    replaced by their file where it is on disk. `remove`: delete the packed JSON files afterwards."""
    folder = Path(folder)
    into = Path(into) if into is not None else folder
    written = _pack_files(folder, packable(folder), into, lambda rel: corpus_of(rel) or OTHER, folder.name, remove)
    if remove:
        _prune_empty(folder)
    return written


def pack_loose(root: Path = RESULTS, remove: bool = False, into: Path | None = None) -> list[Path]:
    """Pack the root's own JSON files (core_*.json, estimators_*.json, ...) into `<word>.jsonl`."""
    root = Path(root)
    return _pack_files(root, sorted(root.glob("*.json")), Path(into) if into is not None else root,
                       loose_group, None, remove)


def pack_all(root: Path = RESULTS, remove: bool = False, into: Path | None = None) -> list[Path]:
    """Pack every study folder of `root` (and its loose files) into the records files of `into`
    (default: root itself)."""
    root = Path(root)
    into = Path(into) if into is not None else root
    out = pack_loose(root, remove, into)
    for study in sorted(p for p in root.iterdir() if p.is_dir()):
        if packable(study) or any(p.name.endswith(SUFFIXES) for p in study.iterdir()):
            out += pack(study, remove, into / study.name)
    return out


def _prune_empty(folder: Path) -> None:
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()


def unpack(records_file: Path, dest: Path) -> list[Path]:
    """Write each file of a records file under `dest` (the study folder's stand-in), text exactly
    as packed; the paths written. A file already there with that text is left alone, and one that
    differs is replaced whole (a study reading the folder meanwhile never sees half a record)."""
    from rltok.config.files import write_atomic

    dest = Path(dest)
    written = []
    for line in read_lines(records_file):
        p = dest / line["file"]
        text = text_of(line)
        if not (p.is_file() and p.read_text(encoding="utf-8") == text):
            p.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(p, text)
        written.append(p)
    return written


def unpack_all(dest: Path, root: Path = RESULTS, plain: bool = True) -> int:
    """Recreate the results tree under `dest`: every records file unpacked where its files were,
    and (`plain`) the files kept as they are (tables, predictions, plots) copied beside them; the
    number of files written."""
    root, dest = Path(root), Path(dest)
    n = 0
    for rf in records_files(root):
        n += len(unpack(rf, dest / study_folder(rf).relative_to(root)))
    if plain:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.name.endswith(SUFFIXES):
                target = dest / p.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, target)
                n += 1
    return n


def entries(study: str, corpus: str | None = None, root: Path = RESULTS) -> list[tuple[str, dict]]:
    """[(file, record)] of a study (a folder under the root, e.g. "scaling" or
    "scaling_1e13_lr"), of one corpus or all, in file order."""
    folder = Path(root) / study
    if corpus is None:
        files = [p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)]
    else:
        files = [folder / (corpus + s) for s in SUFFIXES if (folder / (corpus + s)).exists()]
    out = [(line["file"], line["record"]) for rf in sorted(files) for line in read_lines(rf)]
    return sorted(out, key=lambda e: e[0])


def extract(study: str, file: str, dest: Path, root: Path = RESULTS) -> Path:
    """Write one packed file of a study (`file` as packed, e.g. "code-py/rl_s0.json") into the
    folder `dest`, under its own name; its path. A file that is not packed is a KeyError."""
    folder = Path(root) / study
    for rf in sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)):
        for line in read_lines(rf):
            if line["file"] == file:
                target = Path(dest) / file.rsplit("/", 1)[-1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text_of(line), encoding="utf-8")
                return target
    raise KeyError(f"{file} is not packed in {folder}")


def load(study: str, corpus: str | None = None, pattern: str = "*.json", root: Path = RESULTS) -> list[dict]:
    """The records of a study (and corpus) whose file names match `pattern`, in file order; e.g.
    load("scaling", "docs-en", "C*__*__N*__s*.json") are the scaling study's run records there, as
    `rltok.analysis.scaling.read_records` reads them from an unpacked folder."""
    return [rec for rel, rec in entries(study, corpus, root) if fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pattern)]


# ------------------------------------------------------------------ the schema

def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_or_none(v) -> bool:
    return v is None or (_number(v) and math.isfinite(v))


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v) -> bool:
    return isinstance(v, str)


def _dict(v) -> bool:
    return isinstance(v, dict)


# kind -> {key: (check, what it must be)}
SCHEMAS: dict[str, dict] = {
    # rltok scaling (and scaling_variant.py): one point of an isoFLOP study
    "scaling_run": {
        "corpus": (_str, "a string"), "family": (_str, "a string"), "budget_flops": (_number, "a number"),
        "seed": (_int, "an integer"), "bpb": (_finite_or_none, "a finite number, or null when diverged"),
        "non_embedding_params": (_number, "a number"), "target_size": (_number, "a number"),
        "split": (_str, "a string"), "wall_s": (_number, "a number"),
    },
    # rltok compare: one method and seed at a training budget
    "compare_run": {
        "method": (_str, "a string"), "seed": (_int, "an integer"), "bpb": (_finite_or_none, "a finite number or null"),
        "split": (_str, "a string"), "data": (_str, "a string"), "config": (_dict, "an object"),
        "commit": (_str, "a string"), "wall_s": (_number, "a number"),
    },
    # rltok vocab on a checkpoint
    "vocab": {"checkpoint": (_str, "a string"), "data": (_str, "a string"), "split": (_str, "a string"),
              "seed": (_int, "an integer")},
    # anything else the lab wrote (diagnoses, fits, instruments' results): a JSON object
    "json": {},
}
COMPARE_STUDIES = {"compare", "boundaries", "boundaries_phase", "boundaries_vocab", "bpe_baseline", "embedding",
                   "ablation", "frontier", "phase_val", "rate_price", "rate_price_val"}


def kind_of(rel: str, study: str | None = None) -> str:
    """A record's kind from its path (relative to the study folder) and its study's name."""
    name = rel.rsplit("/", 1)[-1]
    if fnmatch.fnmatch(name, "C*__*__N*__s*.json"):
        return "scaling_run"
    if study in COMPARE_STUDIES and fnmatch.fnmatch(name, "*_s[0-9]*.json"):
        return "compare_run"
    if study == "vocab":
        return "vocab"
    return "json"


def validate(record, file: str, kind: str | None = None, study: str | None = None) -> None:
    """Raise RecordError naming `file` and the key when `record` does not fit its kind's schema."""
    kind = kind or kind_of(file, study)
    if not isinstance(record, dict):
        raise RecordError(f"{file}: a {kind} record must be a JSON object, got {type(record).__name__}")
    for key, (ok, what) in SCHEMAS[kind].items():
        if key not in record:
            raise RecordError(f"{file}: {kind} record lacks key {key!r}")
        if not ok(record[key]):
            raise RecordError(f"{file}: {kind} record key {key!r} must be {what}, got {record[key]!r}")


def check(root: Path = RESULTS) -> list[str]:
    """Every packed record validated; the problems (empty when all fit)."""
    root = Path(root)
    problems = []
    for rf in records_files(root):
        rel_folder = study_folder(rf).relative_to(root)
        study = rel_folder.parts[0] if rel_folder.parts else None
        for line in read_lines(rf):
            try:
                validate(line["record"], f"{rf.relative_to(root)}: {line['file']}", kind_of(line["file"], study))
            except RecordError as e:
                problems.append(str(e))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["pack", "unpack", "check", "extract"])
    ap.add_argument("dest", nargs="?", help="unpack: the folder that stands in for the results root; "
                    "extract: STUDY/FILE (e.g. compare/code-py/rl_s0.json)")
    ap.add_argument("into", nargs="?", help="extract: the folder the file is written into")
    ap.add_argument("--root", default=str(RESULTS))
    ap.add_argument("--remove", action="store_true", help="pack: delete the JSON files once packed")
    ap.add_argument("--from", dest="source", help="pack: the JSON files of this tree (e.g. an unpacked copy where "
                    "new runs were written) into the root's records files (default: the root's own)")
    args = ap.parse_args(argv)
    if args.action == "pack":
        source = Path(args.source) if args.source else Path(args.root)
        for p in pack_all(source, args.remove, Path(args.root)):
            print(p)
    elif args.action == "extract":
        if not args.dest or not args.into or "/" not in args.dest:
            ap.error("extract needs STUDY/FILE and a folder")
        study, file = args.dest.split("/", 1)
        try:
            print(extract(study, file, Path(args.into), Path(args.root)))
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 1
    elif args.action == "unpack":
        if not args.dest:
            ap.error("unpack needs DEST")
        print(f"{unpack_all(Path(args.dest), Path(args.root))} files under {args.dest}")
    else:
        problems = check(Path(args.root))
        print("\n".join(problems) or "every record fits its schema")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
