#!/usr/bin/env bash
# version.sh prints what `make build` stamps into rld and what `make deb`
# names the package:
#
#   scripts/version.sh version        v1.2.0, v1.2.0-3-g0123abc-dirty, 0123abc (no tag), or dev
#   scripts/version.sh commit         the full commit hash, or unknown
#   scripts/version.sh deb [VERSION]  the Debian version of VERSION (default: the above)
#
# Without git (a source tarball) the version is the first line of a VERSION
# file at the top of the tree, if there is one, else "dev".
set -euo pipefail
cd "$(dirname "$0")/.."

version() {
  if git rev-parse --git-dir >/dev/null 2>&1; then
    git describe --tags --always --dirty 2>/dev/null && return
  fi
  if [[ -s VERSION ]]; then head -n1 VERSION; else echo dev; fi
}

commit() {
  git rev-parse HEAD 2>/dev/null || echo unknown
}

# deb maps a git describe string to a Debian version that sorts the way the
# commits do: v1.2.0 -> 1.2.0; v1.2.0-3-g0123abc -> 1.2.0+3.g0123abc;
# a pre-release v1.2.0-rc1 -> 1.2.0~rc1 (before 1.2.0);
# a bare hash (no tag yet) -> 0.0.0+git<commit count>.g<hash>; -dirty
# appends .dirty; anything else -> 0.0.0+dev.
deb() {
  local v=$1 dirty=""
  if [[ $v == *-dirty ]]; then v=${v%-dirty}; dirty=.dirty; fi
  if [[ $v =~ ^v?([0-9][0-9A-Za-z.~-]*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
    local tag=${BASH_REMATCH[1]//-/\~}
    echo "${tag}+${BASH_REMATCH[2]}.g${BASH_REMATCH[3]}${dirty}"
  elif [[ $v =~ ^[0-9a-f]{7,40}$ ]]; then
    local n
    n=$(git rev-list --count HEAD 2>/dev/null || echo 0)
    echo "0.0.0+git${n}.g${v}${dirty}"
  elif [[ $v =~ ^v?([0-9][0-9A-Za-z.~-]*)$ ]]; then
    local tag=${BASH_REMATCH[1]//-/\~}
    if [[ -n $dirty ]]; then echo "${tag}+dirty"; else echo "${tag}"; fi
  else
    echo "0.0.0+dev"
  fi
}

case "${1:-version}" in
  version) version ;;
  commit) commit ;;
  deb) deb "${2:-$(version)}" ;;
  *) echo "usage: $0 version|commit|deb [VERSION]" >&2; exit 2 ;;
esac
