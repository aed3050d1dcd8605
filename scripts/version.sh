#!/usr/bin/env bash
# version.sh prints what `make build` stamps into rld and what `make deb`
# names the package:
#
#   scripts/version.sh version        1.2.0 (tag v1.2.0), 1.2.0-3-g0123abc-dirty, 0123abc (no tag), or dev
#   scripts/version.sh commit         the full commit hash, or unknown
#   scripts/version.sh deb [VERSION]  the Debian version of VERSION (default: the above): 1.2.0-1
#   scripts/version.sh release        the version of the release tag at HEAD (1.2.0 for v1.2.0);
#                                     fails unless HEAD is tagged vX.Y.Z[-pre] and the tree is clean
#
# A release is a tag vMAJOR.MINOR.PATCH (v0.3.0), or with a pre-release
# suffix (v0.3.0-rc1); the version drops the "v". Without git (a source
# tarball) the version is the first line of a VERSION file at the top of
# the tree, if there is one, else "dev".
set -euo pipefail
cd "$(dirname "$0")/.."

version() {
  local v
  if git rev-parse --git-dir >/dev/null 2>&1 && v=$(git describe --tags --always --dirty --match 'v[0-9]*' 2>/dev/null); then
    echo "${v#v}"
    return
  fi
  if [[ -s VERSION ]]; then head -n1 VERSION; else echo dev; fi
}

# release prints the version of the release tag at HEAD, or fails saying
# why there is none.
release() {
  local tag
  if ! tag=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null); then
    echo "version.sh: HEAD is not a release tag: tag it first (git tag v0.3.0)" >&2
    return 1
  fi
  if [[ ! $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]]; then
    echo "version.sh: tag $tag is not vMAJOR.MINOR.PATCH[-PRE]" >&2
    return 1
  fi
  if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    echo "version.sh: the tree has uncommitted changes: a release is built from the tag alone" >&2
    return 1
  fi
  echo "${tag#v}"
}

commit() {
  git rev-parse HEAD 2>/dev/null || echo unknown
}

# deb maps a version (git describe, with or without its "v") to a Debian
# version that sorts the way the commits do, with the package revision 1:
# 1.2.0 -> 1.2.0-1; 1.2.0-3-g0123abc -> 1.2.0+3.g0123abc-1;
# a pre-release 1.2.0-rc1 -> 1.2.0~rc1-1 (before 1.2.0-1);
# a bare hash (no tag yet) -> 0.0.0+git<commit count>.g<hash>-1; -dirty
# appends .dirty; anything else -> 0.0.0+dev-1.
deb() {
  echo "$(upstream "$1")-1"
}

# upstream is deb's version without the revision.
upstream() {
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
  release) release ;;
  *) echo "usage: $0 version|commit|deb [VERSION]|release" >&2; exit 2 ;;
esac
