#!/usr/bin/env bash
# deps.sh installs, through apt-get, the programs that rld's tests start as
# real processes, when they are missing, and checks again afterwards.
#
# Each line of NEEDS is "command package..." : when `command` is not on the
# PATH (or, for a path, does not exist), the packages are installed with one
# apt-get command of their own (some, like nginx's Lua module, break when
# installed together with others). Add a line when a test needs a new program.
set -euo pipefail

NEEDS=(
  "redis-server redis-server"
  "redis-cli redis-tools"
  "python3 python3"
  "/usr/lib/python3/dist-packages/wheel python3-venv python3-setuptools python3-wheel"
  "gunicorn gunicorn"
  "/usr/lib/python3/dist-packages/uvicorn python3-uvicorn"
  "nginx nginx"
  "/usr/lib/nginx/modules/ngx_http_lua_module.so libnginx-mod-http-lua"
  "php php-cli"
  "php-fpm8.2 php-fpm"
  "wrk wrk"
  "dpkg-architecture dpkg-dev"
  "lintian lintian"
  "promtool prometheus"
  "systemd-analyze systemd"
  "systemd-socket-activate systemd"
  "man man-db"
  "podman podman"
)

missing=()
for need in "${NEEDS[@]}"; do
  read -r cmd pkgs <<<"$need"
  if [[ "$cmd" == /* ]]; then [[ -e "$cmd" ]] && continue; else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  missing+=("$need")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ "$(id -u)" != 0 ]]; then
  echo "deps: missing: ${missing[*]%% *}; installing needs root: run 'sudo make deps' once" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
for need in "${missing[@]}"; do
  read -r cmd pkgs <<<"$need"
  echo "deps: installing $pkgs (for $cmd) with apt-get"
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
done

failed=0
for need in "${missing[@]}"; do
  read -r cmd pkgs <<<"$need"
  if [[ "$cmd" == /* ]]; then [[ -e "$cmd" ]] && continue; else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  echo "deps: $cmd is still missing after installing $pkgs" >&2
  failed=1
done
exit $failed
