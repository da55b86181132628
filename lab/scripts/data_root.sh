# Sourced by the sweep scripts: checks the DATA_ROOT argument and sets ROOT to its absolute path
# (before the scripts cd to the repository, so a relative DATA_ROOT keeps its meaning).
#   source "$(dirname "$0")/data_root.sh" "usage: ..." "$@"
require_data_root() {
  local usage=$1
  shift
  if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    [ $# -lt 1 ] || echo "error: DATA_ROOT $1 is not a folder" >&2
    echo "$usage" >&2
    exit 2
  fi
  ROOT=$(cd "$1" && pwd)
}
require_data_root "$@"
