#!/usr/bin/env bash
# bench.sh measures what rld's web clients cost, with wrk against nginx on
# loopback, all in one run (docs/performance.md, "Clients"):
#   static     a static file, no rld
#   static_headers  the same file with the five rate-limit header fields
#              added by add_header (constant values, no Lua)
#   lua_empty  the same file behind an empty access_by_lua_block
#   lua_floor  behind an access_by_lua_block that reads the client's
#              address and sets the five fields to constants: the least a
#              Lua client must do
#   lua        the same file behind rld.lua's access helper (pipelined)
#   lua_pool   the same, one pooled connection per check (pipeline = false)
#   lua_before with BEFORE=path/to/an/older/rld.lua: that file in place of
#              rld.lua, for a before/after comparison in the same run
#   auth       the same file behind the auth_request recipe
#   proxy      a request proxied to an application (a second nginx
#              serving the file over a keep-alive upstream), without and
#              with rld.lua (proxy_lua)
#   php        a PHP page under php-fpm, without and with Rld.php's check,
#              and without Rld.php behind rld.lua (php_lua)
# Each round runs every case twice, interleaved: unpinned (nginx, php-fpm,
# rld and wrk wherever the kernel puts them) and pinned (nginx's one
# worker and php-fpm on CPU 0, rld and wrk on CPU 1, as on a host where
# the web server has its own core; the application, the second nginx or
# php-fpm, shares it), so that a neighbour's burst hits both alike. It
# prints each round's figures and, per case and mode, the median over the
# rounds of: requests/s, its ratio to the baseline's in the same round
# (static; static_c1 for lua_c1; proxy for proxy_lua; nocheck.php for
# php), p50, p99 minus the baseline's, and the CPU per request of nginx
# (the application's nginx not included) and of rld.
# Usage: clients/openresty/bench.sh [DURATION] [ROUNDS] (default 5s, 5);
# needs nginx, libnginx-mod-http-lua, php-fpm8.2, wrk and taskset (make
# deps). CONNS=32 and TIMEOUT_MS=200 (the clients' check timeout) by
# default; CASES="static lua ..." runs only those cases (with their
# baselines), MODES=unpinned (or pinned) only that mode, BASE=lua_empty
# the baseline of the plain cases instead of static. A before/after of
# rld.lua against the empty Lua block, in one run:
#   BEFORE=old/rld.lua BASE=lua_empty CASES="lua lua_before" clients/openresty/bench.sh 2s 5
set -euo pipefail
DURATION=${1:-5s}
ROUNDS=${2:-5}
CONNS=${CONNS:-32}
BASE=${BASE:-static}
# A check that times out fails open and costs nothing: on a loaded machine
# the default 5 ms would flatter the figures. The run reports failures.
TIMEOUT_MS=${TIMEOUT_MS:-200}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d /tmp/rldbench.XXXX)
pids=()
cleanup() {
  # bash reports each job it reaps killed ("Killed ..."): not an error here.
  {
    for p in "${pids[@]}"; do kill -9 -- "-$p" || kill -9 "$p" || true; done
    wait || true
    rm -rf "$TMP"
  } 2>/dev/null
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
setsid php-fpm8.2 -F -R -y "$TMP/fpm.conf" & pids+=($!); FPM_PID=$!
wait_for "$TMP/fpm.sock"

mkdir -p "$TMP/www" "$TMP/lib" "$TMP/app"
echo "hello" >"$TMP/www/static"
if [ -n "${BEFORE:-}" ]; then cp "$BEFORE" "$TMP/lib/rld_before.lua"; fi
cp "$REPO"/clients/php/testdata/www/*.php "$TMP/www/"
P1=$(free_port); P2=$(free_port); P3=$(free_port)
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
  lua_package_path "$REPO/clients/openresty/?.lua;$TMP/lib/?.lua;;";
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
    location = /lua-before {
      access_by_lua_block { require("rld_before").access{ socket = "unix:$TMP/rld.sock", timeout = $TIMEOUT_MS, shared_dict = "rld" } }
      try_files /static =404;
    }
    location = /proxy { proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://app/static; }
    location = /proxy-lua {
      access_by_lua_block { require("rld").access{ socket = "unix:$TMP/rld.sock", timeout = $TIMEOUT_MS, shared_dict = "rld" } }
      proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://app/static;
    }
    location = /lua.php {
      access_by_lua_block { require("rld").access{ socket = "unix:$TMP/rld.sock", timeout = $TIMEOUT_MS, shared_dict = "rld" } }
      include /etc/nginx/fastcgi_params;
      fastcgi_param SCRIPT_FILENAME \$document_root/nocheck.php;
      fastcgi_param RLD_CLIENT $REPO/clients/php/Rld.php;
      fastcgi_pass unix:$TMP/fpm.sock;
    }
    location = /lua-empty {
      access_by_lua_block { }
      try_files /static =404;
    }
    location = /static-headers {
      add_header X-RateLimit-Limit 1000000000;
      add_header X-RateLimit-Remaining 999999999;
      add_header X-RateLimit-Reset 1;
      add_header RateLimit '"bench";r=999999999;t=1';
      add_header RateLimit-Policy '"bench";q=1000000000;w=1';
      try_files /static =404;
    }
    location = /lua-floor {
      access_by_lua_block {
        local ip = ngx.var.remote_addr
        local h = ngx.header
        h["X-RateLimit-Limit"] = "1000000000"
        h["X-RateLimit-Remaining"] = "999999999"
        h["X-RateLimit-Reset"] = "1"
        h["RateLimit"] = '"bench";r=999999999;t=1'
        h["RateLimit-Policy"] = '"bench";q=1000000000;w=1'
      }
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
  upstream app { server 127.0.0.1:$P3; keepalive 32; }
}
NGINX
# The application behind /proxy: another nginx, one worker, no Lua.
cat >"$TMP/app/nginx.conf" <<NGINX
daemon off; master_process off; worker_rlimit_nofile 4096;
error_log $TMP/app/error.log warn; pid $TMP/app/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/app; proxy_temp_path $TMP/app; fastcgi_temp_path $TMP/app; uwsgi_temp_path $TMP/app; scgi_temp_path $TMP/app;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$P3; root $TMP/www; location = /static { } }
}
NGINX
setsid nginx -p "$TMP/app" -c "$TMP/app/nginx.conf" & pids+=($!); APP_PID=$!
setsid nginx -p "$TMP" -c "$TMP/nginx.conf" & pids+=($!); NGINX_PID=$!
wait_port "$P1"; wait_port "$P2"; wait_port "$P3"

# Every URL must answer 200 with rld's headers where rld is asked.
for u in "$P1/static" "$P1/lua" "$P2/static" "$P1/nocheck.php" "$P1/check.php" "$P1/proxy" "$P1/proxy-lua" "$P1/lua.php" ${BEFORE:+"$P1/lua-before"}; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$u")
  [ "$code" = 200 ] || { echo "bench: http://127.0.0.1:$u answered $code" >&2; cat "$TMP/error.log" >&2; exit 1; }
done
for u in lua proxy-lua lua.php ${BEFORE:+lua-before}; do
  curl -si "http://127.0.0.1:$P1/$u" | grep -q '^X-RateLimit-Limit' || { echo "bench: /$u has no rate-limit headers" >&2; exit 1; }
done
curl -si "http://127.0.0.1:$P2/static" | grep -q '^X-RateLimit-Limit' || { echo "bench: auth_request has no rate-limit headers" >&2; exit 1; }

# us converts wrk's "1.23ms" / "456.00us" / "1.2s" to microseconds.
us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else print n * 1000000 }'; }
# ticks returns a process's user+system CPU time in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)
FPM_PIDS="$FPM_PID $(pgrep -d ' ' -P "$FPM_PID" || true)"
# pin puts the web tier (nginx, php-fpm) on CPU 0 and rld on CPU 1, or
# lets them all run anywhere; wrk follows rld.
pin() {
  local web=$1 other=$2
  taskset -apc "$web" "$NGINX_PID" >/dev/null
  for p in $FPM_PIDS $APP_PID; do taskset -apc "$web" "$p" >/dev/null 2>&1 || true; done
  taskset -apc "$other" "$RLD_PID" >/dev/null
  WRK_CPUS=$other
}
# run MODE ROUND CASE CONNS URL: one wrk run; one line "mode round case
# rps p50 p99 nginx_us rld_us".
run() {
  local mode=$1 round=$2 name=$3 conns=$4 url=$5 out n0 r0 n1 r1 reqs
  n0=$(ticks "$NGINX_PID"); r0=$(ticks "$RLD_PID")
  out=$(taskset -c "$WRK_CPUS" wrk -t1 -c"$conns" -d"$DURATION" --latency "$url")
  n1=$(ticks "$NGINX_PID"); r1=$(ticks "$RLD_PID")
  reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
  printf '%s %s %s %s %s %s %s %s\n' "$mode" "$round" "$name" \
    "$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")" \
    "$(us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")" \
    "$(us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")" \
    "$(awk -v t=$((n1 - n0)) -v r="$reqs" -v hz="$HZ" 'BEGIN { printf "%.1f", 1e6 * t / hz / r }')" \
    "$(awk -v t=$((r1 - r0)) -v r="$reqs" -v hz="$HZ" 'BEGIN { printf "%.1f", 1e6 * t / hz / r }')"
}
# name:connections:address. The _c1 cases, one connection, measure the
# latency a check adds to a request when nginx is not saturated (with
# $CONNS connections the worker is CPU-bound and p99 follows requests/s).
ALL="static:$CONNS:$P1/static lua_empty:$CONNS:$P1/lua-empty lua_floor:$CONNS:$P1/lua-floor static_headers:$CONNS:$P1/static-headers lua:$CONNS:$P1/lua ${BEFORE:+lua_before:$CONNS:$P1/lua-before}
  lua_pool:$CONNS:$P1/lua-pool auth:$CONNS:$P2/static proxy:$CONNS:$P1/proxy proxy_lua:$CONNS:$P1/proxy-lua
  php_nocheck:$CONNS:$P1/nocheck.php php_check:$CONNS:$P1/check.php php_lua:$CONNS:$P1/lua.php
  static_c1:1:$P1/static lua_c1:1:$P1/lua ${BEFORE:+lua_before_c1:1:$P1/lua-before} lua_pool_c1:1:$P1/lua-pool"
# CASES picks some of them; each case's baseline runs too.
RUN=""
for c in $ALL; do
  name=${c%%:*}
  if [ -z "${CASES:-}" ]; then RUN="$RUN $c"; continue; fi
  for want in $CASES; do
    base=$BASE; case $want in php_*) base=php_nocheck ;; proxy*) base=proxy ;; *_c1) base=static_c1 ;; esac
    if [ "$name" = "$want" ] || [ "$name" = "$base" ]; then RUN="$RUN $c"; break; fi
  done
done
if [ -z "${MODES:-}" ]; then
  MODES="unpinned"
  if [ "$NCPU" -ge 2 ]; then MODES="unpinned pinned"; else echo "bench: one CPU: no pinned runs" >&2; fi
fi
echo "wrk -t1 -c$CONNS (-c1 for the _c1 cases) -d$DURATION --latency, $ROUNDS rounds; $NCPU CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pinned: nginx (one worker), the application (php-fpm, the second nginx) on CPU 0, rld and wrk on CPU 1; unpinned: anywhere"
printf '%-9s %5s %-12s %10s %8s %8s %9s %7s\n' mode round case "req/s" "p50 us" "p99 us" "nginx us" "rld us"
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    if [ "$mode" = pinned ]; then pin 0 1; else pin "0-$((NCPU - 1))" "0-$((NCPU - 1))"; fi
    for c in $RUN; do
      IFS=: read -r name conns addr <<<"$c"
      run "$mode" "$round" "$name" "$conns" "http://127.0.0.1:$addr"
    done
  done
done | tee "$TMP/results" | awk '{ printf "%-9s %5s %-12s %10.0f %8.0f %8.0f %9s %7s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "checks that failed (timed out) in the Lua runs: $(curl -s "http://127.0.0.1:$P1/rld-failures")"
echo
echo "median over $ROUNDS rounds (ratio and p99 against the same round's baseline: $BASE, static_c1 for the _c1 cases, proxy for proxy_lua, nocheck.php for php):"
printf '%-9s %-12s %10s %9s %7s %12s %9s %7s\n' mode case "req/s" "vs base" "p50 us" "p99 vs base" "nginx us" "rld us"
awk -v base0="$BASE" '
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { rps[$1, $2, $3] = $4; p99[$1, $2, $3] = $6; p50[$1, $3] = p50[$1, $3] " " $5; nus[$1, $3] = nus[$1, $3] " " $7; rus[$1, $3] = rus[$1, $3] " " $8
    rounds[$2] = 1; modes[$1] = 1; if (!($3 in seen)) { seen[$3] = 1; order[++nc] = $3 } }
  END {
    for (m in modes) for (i = 1; i <= nc; i++) {
      c = order[i]; base = c ~ /^php_/ ? "php_nocheck" : c ~ /^proxy/ ? "proxy" : c ~ /_c1$/ ? "static_c1" : base0
      r = ""; d = ""; q = ""
      for (k in rounds) { q = q " " rps[m, k, c]; r = r " " rps[m, k, c] / rps[m, k, base]; d = d " " p99[m, k, c] - p99[m, k, base] }
      printf "%-9s %-12s %10.0f %8.2fx %7.0f %+9.0f us %9.1f %7.1f\n", m, c, median(q), median(r), median(p50[m, c]), median(d), median(nus[m, c]), median(rus[m, c])
    }
  }' "$TMP/results" | sort -s -k1,1r
