#!/usr/bin/env bash
# gphash serve and redis-server 7 (AOF, appendfsync always) in turn, PAIRS times for each test,
# so that each ratio compares runs of the same minute; then redis-server with appendfsync
# everysec once a test. Each run is a fresh server that first takes 2 M SETs on the keys the
# tests use (so that GETs find most of them), then a window of WINDOW seconds in the middle of
# a long redis-benchmark run: 50 clients in two processes of 25, 4 threads each, 1 M random
# keys; requests/s as the server counts them (INFO's total_commands_processed) over the
# measured interval.
#   scripts/serve-pairs.sh [DIR]   DIR holds the pools and AOF files (default /dev/shm)
# Knobs: TESTS ("set:64": test:pipeline pairs), PAIRS (5), WINDOW (6), GPHASH (the binary;
# default target/release/gphash), SERVE_ENV (environment of the gphash server, e.g.
# MIMALLOC_PURGE_DELAY=-1), SERVE_OPTS (more options of gphash serve, e.g. --batch-wait-us 50),
# REDIS (0: the gphash runs alone). Needs redis-benchmark and redis-cli (and redis-server unless
# REDIS=0), or their Debian packages in .gl-redis/ (scripts/redis-tools.sh). Prints a line a
# run; tee it where it should go.
set -u
root=$(pwd)
dir=${1:-/dev/shm}
gphash=${GPHASH:-$root/target/release/gphash}
log=/tmp/gphash-pairs.log
. "$root/scripts/redis-tools.sh"
need=(redis-benchmark redis-cli)
[ "${REDIS:-1}" = 0 ] || need+=(redis-server)
for tool in "${need[@]}"; do
  command -v "$tool" >/dev/null || { echo "serve-pairs: no $tool (see scripts/redis-tools.sh)" >&2; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
echo "cores $(nproc); NUMA nodes $(ls -d /sys/devices/system/node/node* | wc -l); numa_balancing $(cat /proc/sys/kernel/numa_balancing 2>/dev/null)"
# What a run leaves behind if the script stops in its middle: the servers, the clients, the
# pool and the AOF.
server='' clients=()
cleanup() {
  [ ${#clients[@]} -eq 0 ] || kill "${clients[@]}" 2>/dev/null
  [ -z "$server" ] || kill "$server" 2>/dev/null
  redis-cli -p 6391 shutdown nosave >/dev/null 2>&1
  rm -rf "$dir/gphash-pairs-aof" "$dir/gphash-pairs.pool"
}
trap cleanup EXIT
count() { redis-cli -p "$1" info stats | tr -d '\r' | awk -F: '/total_commands_processed/{print $2}'; }
# PORT: the warm-up's SETs.
warm() { redis-benchmark -p "$1" -t set -n 2000000 -c 50 -P 64 -r 1000000 --threads 4 --csv >/dev/null 2>&1; }
# PORT TEST PIPELINE: requests/s over a window of WINDOW seconds.
window() {
  local c0 c1 t0 t1
  clients=()
  for _ in 1 2; do
    redis-benchmark -p "$1" -t "$2" -n 400000000 -c 25 -P "$3" -r 1000000 --threads 4 --csv >/dev/null 2>&1 &
    clients+=($!)
  done
  sleep 2
  t0=$(date +%s.%N) c0=$(count "$1")
  sleep "${WINDOW:-6}"
  t1=$(date +%s.%N) c1=$(count "$1")
  kill "${clients[@]}"
  wait "${clients[@]}" 2>/dev/null
  clients=()
  awk -v a="$c0" -v b="$c1" -v x="$t0" -v y="$t1" 'BEGIN { printf "%.0f\n", (b - a) / (y - x) }'
}
# FSYNC TEST PIPELINE
redis() {
  rm -rf "$dir/gphash-pairs-aof"
  redis-server --port 6391 --appendonly yes --appendfsync "$1" --dir "$dir" --appenddirname gphash-pairs-aof \
    --save "" --daemonize yes >/dev/null
  sleep 1
  [ "$(redis-cli -p 6391 ping 2>/dev/null)" = PONG ] || { echo "serve-pairs: redis-server did not start" >&2; exit 1; }
  warm 6391
  echo "redis-server $1 $2 pipeline $3: $(window 6391 "$2" "$3") requests/s"
  redis-cli -p 6391 shutdown nosave >/dev/null 2>&1
  sleep 1
  rm -rf "$dir/gphash-pairs-aof"
}
# TEST PIPELINE
serve() {
  local pool=$dir/gphash-pairs.pool
  rm -f "$pool" "$log"
  # SERVE_ENV and SERVE_OPTS are split into words.
  # shellcheck disable=SC2086
  env ${SERVE_ENV:-} "$gphash" serve "$pool" --bind 127.0.0.1:6390 --gpu-start wait ${SERVE_OPTS:-} >"$log" 2>&1 &
  server=$!
  until grep -q "listening on" "$log" 2>/dev/null; do
    sleep 0.2
    kill -0 "$server" 2>/dev/null || { cat "$log"; exit 1; }
  done
  warm 6390
  echo "gphash${SERVE_ENV:+ $SERVE_ENV}${SERVE_OPTS:+ $SERVE_OPTS} $1 pipeline $2: $(window 6390 "$1" "$2") requests/s"
  kill "$server"
  wait "$server" 2>/dev/null
  server=''
  grep -iE "warn|error" "$log" | head -3
  rm -f "$pool"
}
for t in ${TESTS:-set:64}; do
  case $t in *:*) ;; *) echo "serve-pairs: a test is TEST:PIPELINE, not $t" >&2; exit 1 ;; esac
  for _ in $(seq "${PAIRS:-5}"); do
    [ "${REDIS:-1}" = 0 ] || redis always "${t%:*}" "${t#*:}"
    serve "${t%:*}" "${t#*:}"
  done
  [ "${REDIS:-1}" = 0 ] || redis everysec "${t%:*}" "${t#*:}"
done
