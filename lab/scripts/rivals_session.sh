#!/bin/bash
# The rivals study's sessions, one command each (notebook lab/notes/rivals.md, R47, R56, R61).
# Every training step runs from a clean worktree of a fixed commit, never from the checkout it is
# called from, so records always name the code that made them; this checkout only packs records and
# writes tables. Outputs and logs live in $WORK, which may not outlive a session: records are packed
# into lab/results/rivals as they come, and `unpack` puts them back into a fresh $WORK.
#
#   WORK=~/rivals DATA=~/corpora bash lab/scripts/rivals_session.sh COMMAND [ARGS]
#
#   ladder COMMIT CORPUS      the 3e12 ladders of scaling_rivals_grid.toml (recorded points skipped)
#   dpool COMMIT CORPUS       dpool's 3e12 from scaling_rivals_dpool_grid.toml
#   check COMMIT CORPUS       R2's learning-rate check at 3e12, in $WORK/check-out (after `sync`)
#   sync                      $WORK/check-out: every record (packed, then the live ones over them)
#   status CORPUS             where 3e12 stands (counts and hours only)
#   pack                      the live records into lab/results/rivals, the learning-rate check's
#                             into lab/results/rivals_lr_check (then regenerate and commit)
#   unpack                    lab/results/rivals back into $WORK/rivals-out (a fresh $WORK)
#   instruments TAG [OUT]     R53's instrument on the finished seed-0 3e12 runs not yet measured, of
#                             $WORK/rivals-out (or $WORK/OUT, e.g. rerun-out)
#   rerun COMMIT CORPUS RUN...  rerun the named points (record names) into $WORK/rerun-out, from the
#                             commit their records name (lab/scripts/rerun_grid.py; R56's lost runs)
#   rerun-compare CORPUS      whether each rerun reproduces its packed record to the bit
#   running                   the study's processes, and each log's error count (never its lines:
#                             result lines hold numbers a prediction may not yet have read)
#
# WORK: the folder of the worktrees, outputs and logs; DATA: the folder holding docs-en/ and
# code-py/; PY: the Python with rltok's dependencies (default: this checkout's .venv).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
: "${WORK:?set WORK to the folder for worktrees, outputs and logs}"
PY=${PY:-$repo/.venv/bin/python}
mkdir -p "$WORK"

worktree() {  # worktree NAME COMMIT: a clean detached worktree of COMMIT at $WORK/NAME, data linked
  local dir=$WORK/$1 commit=$2
  [ -d "$dir" ] || git -C "$repo" worktree add --detach "$dir" "$commit" >/dev/null
  test "$(git -C "$dir" rev-parse HEAD)" = "$(git -C "$repo" rev-parse "$commit^{commit}")" \
    || { echo "$dir is not at $commit" >&2; exit 2; }
  test -z "$(git -C "$dir" status --porcelain --untracked-files=no)" || { echo "$dir has changes" >&2; exit 2; }
  : "${DATA:?set DATA to the folder holding docs-en/ and code-py/}"
  ln -sfn "$DATA" "$dir/data"
  echo "$dir"
}

at_3e12() {  # at_3e12 GRID OUT: the grid at 3e12 alone, no held-out budget
  sed -e 's/^budgets = .*/budgets = [3e12]/' -e 's/^holdout_budgets = .*/holdout_budgets = []/' "$1" > "$2"
}

copy_live() {  # copy_live CORPUS DEST: the study's live records of CORPUS (the ladders' and dpool's) into DEST
  for live in rivals-out dpool-out; do
    compgen -G "$WORK/$live/$1/C*__*__N*__s*.json" >/dev/null && cp "$WORK/$live/$1/"C*__*__N*__s*.json "$2/"
  done
  return 0
}

launch() {  # launch DIR LOG ARGS...: nohup'd, niced, from DIR's own code
  local dir=$1 log=$2; shift 2
  (cd "$dir" && PYTHONPATH="$dir/src:$dir/lab" nohup nice -n 10 "$PY" "$@" >> "$log" 2>&1 &)
  echo "started: $* (log $log)"
}

cmd=${1:-}; shift || true
case "$cmd" in
  ladder|dpool)
    commit=$1 corpus=$2
    dir=$(worktree "run-$cmd-$(git -C "$repo" rev-parse --short "$commit")" "$commit")
    src=$dir/lab/scripts/scaling_rivals_grid.toml name=rivals log=$WORK/rivals-$corpus-3e12.log
    if [ "$cmd" = dpool ]; then
      src=$dir/lab/scripts/scaling_rivals_dpool_grid.toml name=dpool log=$WORK/dpool-$corpus.log
    fi
    at_3e12 "$src" "$WORK/$name-grid-3e12.toml"
    launch "$dir" "$log" -m rltok.cli scaling --grid "$WORK/$name-grid-3e12.toml" --out "$WORK/$name-out" --corpus "$corpus" ;;
  rerun)
    commit=$1 corpus=$2; shift 2
    dir=$(worktree "run-ladder-$(git -C "$repo" rev-parse --short "$commit")" "$commit")
    (cd "$repo" && PYTHONPATH=src:lab "$PY" lab/scripts/rerun_grid.py grid --grid "$dir/lab/scripts/scaling_rivals_grid.toml" \
      --corpus "$corpus" --runs "$@" --write "$WORK/rerun-$corpus.json")
    launch "$dir" "$WORK/rerun-$corpus.log" -m rltok.cli scaling --grid "$WORK/rerun-$corpus.json" \
      --out "$WORK/rerun-out" --corpus "$corpus" ;;
  rerun-compare)
    corpus=$1
    (cd "$repo" && PYTHONPATH=src:lab "$PY" lab/scripts/rerun_grid.py compare --corpus "$corpus" --rerun "$WORK/rerun-out/$corpus") ;;
  check)
    commit=$1 corpus=$2
    dir=$(worktree "run-check-$(git -C "$repo" rev-parse --short "$commit")" "$commit")
    launch "$dir" "$WORK/check-$corpus.log" -m rltok_lab study --grid lab/scripts/scaling_rivals_grid.toml \
      --out "$WORK/check-out" --corpus "$corpus" --check-optimum 3e12 --lr-mults 0.5 2 --policy-lr-mults 0.5 2 ;;
  sync)
    mkdir -p "$WORK/check-out"
    (cd "$repo" && PYTHONPATH=src:lab "$PY" -c "
from pathlib import Path
from rltok_lab import records
for c in ('docs-en', 'code-py'):
    records.unpack(Path(f'lab/results/rivals/{c}.jsonl.gz'), Path('$WORK/check-out'))
    if Path(f'lab/results/rivals_lr_check/{c}.jsonl.gz').exists():  # a check resumes from its records
        records.unpack(Path(f'lab/results/rivals_lr_check/{c}.jsonl.gz'), Path('$WORK/check-out/optimum_check'))
")
    for c in docs-en code-py; do
      copy_live "$c" "$WORK/check-out/$c"
      echo "$c records: $(ls "$WORK/check-out/$c/"C*.json | wc -l)"
    done ;;
  status)
    corpus=$1
    : "${DATA:?set DATA to the folder holding docs-en/ and code-py/ (completeness is a dry run of the study)}"
    cd "$repo" && ln -sfn "$DATA" data
    PYTHONPATH=src:lab "$PY" -m rltok_lab study --grid lab/scripts/scaling_rivals_grid.toml \
      --out "$WORK/check-out" --corpus "$corpus" --status | grep -E "^\| corpus|C3e12" || true
    rm -f data ;;
  pack)
    tmp=$(mktemp -d)
    for c in docs-en code-py; do
      mkdir -p "$tmp/rivals/$c" "$tmp/rivals_lr_check/$c"
      copy_live "$c" "$tmp/rivals/$c"
      live=$WORK/check-out/optimum_check/$c
      compgen -G "$live/C*__*__N*__s*.json" >/dev/null && cp "$live/"C*__*__N*__s*.json "$tmp/rivals_lr_check/$c/"
    done
    (cd "$repo" && PYTHONPATH=src:lab "$PY" -c "
from pathlib import Path
from rltok_lab import records
print(records.pack(Path('$tmp/rivals'), into=Path('lab/results/rivals')))
if any(Path('$tmp/rivals_lr_check').rglob('*.json')):
    print(records.pack(Path('$tmp/rivals_lr_check'), into=Path('lab/results/rivals_lr_check')))
")
    rm -rf "$tmp"
    echo "next: python -m rltok_lab.regenerate --data \$DATA --only rivals scaling_results; lab tests; commit" ;;
  unpack)
    (cd "$repo" && PYTHONPATH=src:lab "$PY" -c "
from pathlib import Path
from rltok_lab import records
for c in ('docs-en', 'code-py'):
    records.unpack(Path(f'lab/results/rivals/{c}.jsonl.gz'), Path('$WORK/rivals-out'))
") ;;
  instruments)
    tag=$1 live=$WORK/${2:-rivals-out} table=lab/results/rivals/chunk_path_use_3e12.md
    cd "$repo"
    for c in docs-en code-py; do
      runs=()
      for d in "$live/$c/runs/"C3e12__*__s0; do
        [ -d "$d" ] || continue
        stem=$(basename "$d")
        case $stem in *__bpe__*|*__flat*) continue;; esac
        [ -f "$live/$c/$stem.json" ] || continue  # finished runs only
        awk -v s="## $c," -v r="| $stem |" 'index($0, s) == 1 {on = 1; next} /^## / {on = 0} on && index($0, r) == 1 {f = 1} END {exit !f}' \
          "$table" && continue  # measured in an earlier session
        runs+=("$d")
      done
      [ ${#runs[@]} -gt 0 ] || continue
      if grep -qxF "## $c, session $tag" "$table"; then  # put_section would replace its rows
        echo "section '$c, session $tag' exists: give a new TAG" >&2; exit 2
      fi
      ln -sfn "$DATA" data
      PYTHONPATH=src:lab "$PY" lab/scripts/chunk_path_use.py "${runs[@]}" --data "data/$c" --out "/tmp/use_$c.md" > /dev/null
      PYTHONPATH=src:lab "$PY" -c "
from pathlib import Path
from rltok_lab.tables_file import put_section
put_section(Path('$table'), '$c, session $tag', Path('/tmp/use_$c.md').read_text().replace('/tmp/use_$c.md', 'use.md'), '')
"
      rm -f data
      echo "$c: R53's instrument on ${#runs[@]} runs (section '$c, session $tag', written unread)"
    done ;;
  running)
    pgrep -af "rltok.cli scaling|rltok_lab study" | cut -c1-160 || echo "no study process"
    for log in "$WORK"/rivals-*-3e12.log "$WORK"/dpool-*.log "$WORK"/check-*.log "$WORK"/rerun-*.log; do
      [ -f "$log" ] && echo "$(basename "$log"): $(grep -ci "diverg\|error\|traceback" "$log" || true) error lines"
    done ;;
  *)
    sed -n '2,27p' "$0"; exit 2 ;;
esac
