#!/usr/bin/env bash
# bench.sh measures what rld's web clients cost, with wrk against nginx on
# loopback, all in one run (docs/performance.md, "Clients"):
#   static     a static file, no rld
#   lua_empty  the same file behind an empty access_by_lua_block
#   lua        the same file behind rld.lua's access helper (pipelined)
#   lua_pool   the same, one pooled connection per check (pipeline = false)
#   auth       the same file behind the auth_request recipe
#   php        a PHP page under php-fpm, without and with Rld.php's check
# Usage: clients/openresty/bench.sh [DURATION] (default 10s); needs nginx,
# libnginx-mod-http-lua, php-fpm8.2 and wrk (make deps). CONNS=32 and
# TIMEOUT_MS=200 (the clients' check timeout) by default.
set -euo pipefail
DURATION=${1:-10s}
CONNS=${CONNS:-32}
# A check that times out fails open and costs nothing: on a loaded machine
# the default 5 ms would flatter the figures. The run reports failures.
TIMEOUT_MS=${TIMEOUT_MS:-200}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d /tmp/rldbench.XXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "bench: $1 never appeared" >&2; exit 1; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "bench: port $1 never opened" >&2; exit 1; }

(cd "$REPO" && go build -o "$TMP/rld" ./cmd/rld)
cat >"$TMP/rld.toml" <<TOML
[server]
socket = "$TMP/rld.sock"
http = ""
http_socket = "$TMP/http.sock"
trusted_proxies = ["unix"]

[[rule]]
name = "bench"
by = ["ip"]
limit = 1000000000
period = "1s"
TOML
setsid "$TMP/rld" serve -config "$TMP/rld.toml" 2>"$TMP/rld.log" & pids+=($!); RLD_PID=$!
wait_for "$TMP/rld.sock"; wait_for "$TMP/http.sock"

cat >"$TMP/fpm.conf" <<FPM
[global]
daemonize = no
error_log = $TMP/fpm.log
[www]
listen = $TMP/fpm.sock
pm = static
pm.max_children = 2
FPM
setsid php-fpm8.2 -F -R -y "$TMP/fpm.conf" & pids+=($!)
wait_for "$TMP/fpm.sock"

mkdir -p "$TMP/www"
echo "hello" >"$TMP/www/static"
cp "$REPO"/clients/php/testdata/www/*.php "$TMP/www/"
P1=$(free_port); P2=$(free_port)
sed -e "s|/run/rld/http.sock|$TMP/http.sock|" -e "s|127.0.0.1:8080|127.0.0.1:$P2|" -e "s|/var/www/html|$TMP/www|" \
  "$REPO/clients/nginx/auth_request.conf" >"$TMP/auth_request.conf"
cat >"$TMP/nginx.conf" <<NGINX
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off; master_process off; worker_rlimit_nofile 4096;
error_log $TMP/error.log warn; pid $TMP/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP; proxy_temp_path $TMP; fastcgi_temp_path $TMP; uwsgi_temp_path $TMP; scgi_temp_path $TMP;
  lua_package_path "$REPO/clients/openresty/?.lua;;";
  lua_shared_dict rld 1m;
  lua_socket_log_errors off;
  server {
    listen 127.0.0.1:$P1;
    root $TMP/www;
    location = /static { }
    location = /lua {
      access_by_lua_block { require("rld").access{ socket = "unix:$TMP/rld.sock", timeout = $TIMEOUT_MS, shared_dict = "rld" } }
      try_files /static =404;
    }
    location = /lua-pool {
      access_by_lua_block { require("rld").access{ socket = "unix:$TMP/rld.sock", timeout = $TIMEOUT_MS, shared_dict = "rld", pipeline = false } }
      try_files /static =404;
    }
    location = /lua-empty {
      access_by_lua_block { }
      try_files /static =404;
    }
    location = /rld-failures { content_by_lua_block { ngx.say(require("rld").failures("rld")) } }
    location ~ \.php\$ {
      include /etc/nginx/fastcgi_params;
      fastcgi_param SCRIPT_FILENAME \$document_root\$fastcgi_script_name;
      fastcgi_param RLD_SOCKET $TMP/rld.sock;
      fastcgi_param RLD_CLIENT $REPO/clients/php/Rld.php;
      fastcgi_param RLD_TIMEOUT $(awk -v t="$TIMEOUT_MS" 'BEGIN { print t / 1000 }');
      fastcgi_pass unix:$TMP/fpm.sock;
    }
  }
  include $TMP/auth_request.conf;
}
NGINX
setsid nginx -p "$TMP" -c "$TMP/nginx.conf" & pids+=($!); NGINX_PID=$!
wait_port "$P1"; wait_port "$P2"

# Every URL must answer 200 with rld's headers where rld is asked.
for u in "$P1/static" "$P1/lua" "$P2/static" "$P1/nocheck.php" "$P1/check.php"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$u")
  [ "$code" = 200 ] || { echo "bench: http://127.0.0.1:$u answered $code" >&2; cat "$TMP/error.log" >&2; exit 1; }
done
curl -si "http://127.0.0.1:$P1/lua" | grep -q '^X-RateLimit-Limit' || { echo "bench: /lua has no rate-limit headers" >&2; exit 1; }
curl -si "http://127.0.0.1:$P2/static" | grep -q '^X-RateLimit-Limit' || { echo "bench: auth_request has no rate-limit headers" >&2; exit 1; }

# us converts wrk's "1.23ms" / "456.00us" / "1.2s" to microseconds.
us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else print n * 1000000 }'; }
declare -A RPS P99 P50 CPU_NGINX CPU_RLD
# ticks returns a process's user+system CPU time in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
run() {
  local name=$1 url=$2 out n0 r0 n1 r1
  n0=$(ticks "$NGINX_PID"); r0=$(ticks "$RLD_PID")
  out=$(wrk -t1 -c"$CONNS" -d"$DURATION" --latency "$url")
  n1=$(ticks "$NGINX_PID"); r1=$(ticks "$RLD_PID")
  local reqs; reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
  CPU_NGINX[$name]=$(awk -v t=$((n1 - n0)) -v r="$reqs" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", 1e6 * t / hz / r }')
  CPU_RLD[$name]=$(awk -v t=$((r1 - r0)) -v r="$reqs" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", 1e6 * t / hz / r }')
  RPS[$name]=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
  P50[$name]=$(us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
  P99[$name]=$(us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
}
echo "wrk -t1 -c$CONNS -d$DURATION --latency; nginx (one worker), rld and wrk on the same $(nproc) cores"
run static "http://127.0.0.1:$P1/static"
run lua_empty "http://127.0.0.1:$P1/lua-empty"
run lua "http://127.0.0.1:$P1/lua"
run lua_pool "http://127.0.0.1:$P1/lua-pool"
run auth "http://127.0.0.1:$P2/static"
run php_nocheck "http://127.0.0.1:$P1/nocheck.php"
run php_check "http://127.0.0.1:$P1/check.php"
printf '%-12s %12s %10s %10s %14s %16s %14s\n' case "requests/s" "p50 us" "p99 us" "vs baseline" "nginx CPU us/req" "rld CPU us/req"
for n in static lua_empty lua lua_pool auth php_nocheck php_check; do
  base=static; [[ $n == php_* ]] && base=php_nocheck
  ratio=$(awk -v a="${RPS[$n]}" -v b="${RPS[$base]}" 'BEGIN { printf "%.2f", a / b }')
  printf '%-12s %12s %10.0f %10.0f %13sx %16s %14s\n' "$n" "${RPS[$n]}" "${P50[$n]}" "${P99[$n]}" "$ratio" "${CPU_NGINX[$n]}" "${CPU_RLD[$n]}"
done
echo "checks that failed (timed out) in the Lua runs: $(curl -s "http://127.0.0.1:$P1/rld-failures")"
awk -v s="${RPS[static]}" -v l="${RPS[lua]}" -v lp="${RPS[lua_pool]}" -v a="${RPS[auth]}" -v ps="${P99[static]}" -v pl="${P99[lua]}" -v pa="${P99[auth]}" \
  -v pn="${RPS[php_nocheck]}" -v pc="${RPS[php_check]}" 'BEGIN {
  printf "lua:  %.1f%% of the requests/s, p99 %+.0f us\n", 100 * (1 - l / s), pl - ps
  printf "lua_pool: %.1f%% of the requests/s\n", 100 * (1 - lp / s)
  printf "auth: %.1f%% of the requests/s, p99 %+.0f us\n", 100 * (1 - a / s), pa - ps
  printf "php:  %+.0f us per request (1/rps, with vs without the check; %d FPM workers)\n", 1e6 * (1 / pc - 1 / pn) * 2, 2
}'
