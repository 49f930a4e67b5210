#!/usr/bin/env bash
# gphash serve against redis-server 7 (AOF, appendfsync always and everysec) under
# redis-benchmark: SET and GET, 50 clients, pipelines of 1, 16 and 64, 1 M random keys, REPS
# runs each (median, min, max are taken from the CSV). Then the library's own throughput at
# the batch sizes the server formed, for the gap.
#   scripts/serve-bench.sh [DIR]    DIR holds the pools and AOF files (default /dev/shm)
# Needs redis-benchmark and redis-server, or their Debian packages in .gl-redis/ (apt-get
# download redis-server redis-tools libjemalloc2 liblzf1 libatomic1 libssl3), and the gphash
# binary in .gpu-serve/ (or GPHASH). Results go to $OUT: serve-bench.csv, and serve-bench.tgz
# with INFO after each run, the logs and the library's figures. Knobs: REPS (3), SCALE (1:
# requests a run divided by it), WAITS ("0": --batch-wait-us values), FSYNCS ("always
# everysec"; empty: no redis-server), GPHASH_OPTS (more options of gphash serve) with LABEL
# (appended to the server's name in the CSV), LIBRARY_BATCHES ("50 800 3200"; empty: none),
# THREADS (4: redis-benchmark's threads), PIPELINES ("1 16 64"), REQUESTS (a run's requests at
# every depth, instead of SCALE's), CLIENT_CPUS and SERVER_CPUS (taskset lists: redis-benchmark
# on the first, each server, redis-server and gphash alike, on the second; default: unpinned).
set -uo pipefail
client_pin=(${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"})
server_pin=(${SERVER_CPUS:+taskset -c "$SERVER_CPUS"})
root=$(pwd)
final=${OUT:-/tmp/out}
out=$(mktemp -d)
dir=${1:-/dev/shm}
reps=${REPS:-3}
waits=${WAITS:-0}
gphash=${GPHASH:-$root/.gpu-serve/gphash}
keys=1000000
mkdir -p "$out"
. "$root/scripts/redis-tools.sh"
redis-server --version | tee "$out/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee -a "$out/versions.txt"
nproc | tee -a "$out/versions.txt"

# Requests per run (divided by SCALE for a quick try).
# REQUESTS sets it for every pipeline depth: with --threads, redis-benchmark ends a run on a
# 250 ms tick, so a run of 2 s is up to 12% off and one of 10 s up to 2.5%.
requests() {
  [ -n "${REQUESTS:-}" ] && { echo "$REQUESTS"; return; }
  case $1 in 1) echo $((300000 / ${SCALE:-1})) ;; 16) echo $((3000000 / ${SCALE:-1})) ;; *) echo $((8000000 / ${SCALE:-1})) ;; esac
}

# bench LABEL PORT PIPELINE [TESTS]: REPS runs of each test (default SET then GET). With
# --threads, redis-benchmark ends a run on a 250 ms tick, so its own rps of a run of a second is
# up to 25% low: rps_wall (requests over the command's wall time, connecting included) is the
# figure to use.
bench() {
  for t in ${4:-set get}; do
    for r in $(seq "$reps"); do
      n=$(requests "$3")
      t0=$(date +%s.%N)
      line=$("${client_pin[@]}" redis-benchmark -p "$2" -t $t -n "$n" -c 50 -P "$3" -r $keys --threads "${THREADS:-4}" --csv |
        grep -i "^\"$t\"")
      t1=$(date +%s.%N)
      wall=$(awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN { printf "%.3f,%.0f", b - a, n / (b - a) }')
      echo "$1,$3,$r,$line,$wall" | tee -a "$out/serve-bench.csv"
    done
  done
}

echo "server,pipeline,rep,test,rps,avg_ms,min_ms,p50_ms,p95_ms,p99_ms,max_ms,wall_s,rps_wall" >"$out/serve-bench.csv"
for fsync in ${FSYNCS-always everysec}; do
  rm -rf "$dir/redis-$fsync" && mkdir -p "$dir/redis-$fsync"
  "${server_pin[@]}" redis-server --port 6380 --dir "$dir/redis-$fsync" --appendonly yes --appendfsync $fsync --save "" \
    --daemonize yes --logfile "$out/redis-$fsync.log"
  sleep 1
  for p in ${PIPELINES:-1 16 64}; do bench "redis-aof-$fsync" 6380 $p; done
  redis-cli -p 6380 info persistence >"$out/info-redis-$fsync.txt"
  redis-cli -p 6380 shutdown nosave
  sleep 1
  rm -rf "$dir/redis-$fsync"
done
for wait in $waits; do
  pool=$dir/serve-w$wait.pool
  rm -f "$pool"
  for p in ${PIPELINES:-1 16 64}; do
    # A fresh server per pipeline depth, so that its INFO describes that depth alone.
    # Waits for its GPU before it listens: the runs time the GPU, not the CPU model beside it.
    "${server_pin[@]}" "$gphash" serve "$pool" --bind 127.0.0.1:6381 --gpu-start wait --batch-wait-us "$wait" ${GPHASH_OPTS:-} >"$out/serve-w$wait-P$p.log" 2>&1 &
    pid=$!
    until grep -q "listening on" "$out/serve-w$wait-P$p.log"; do sleep 0.2; kill -0 $pid || break; done
    # PING is answered by the connection's task without the batcher: the ceiling of the
    # clients, the network stack and the server's front end.
    bench "gphash${LABEL:-}-w$wait" 6381 $p "set get ping_mbulk"
    redis-cli -p 6381 info >"$out/info-gphash-w$wait-P$p.txt"
    kill -TERM $pid
    wait $pid
  done
  "$gphash" check "$pool" | tail -2 | tee -a "$out/check.txt"
  rm -f "$pool"
done
# The library alone at batch sizes the server forms: 50 clients times the pipeline depth.
for b in ${LIBRARY_BATCHES-50 800 3200}; do
  "$gphash" bench load-search --keys $keys --batch $b --reps 3 --key-bytes 32 --value-bytes 64 \
    --placements zero-copy --pool-dir "$dir" 2>&1 | grep -v "imported buffers" | tee -a "$out/library.txt"
done
tar czf "$final/serve-bench.tgz" -C "$out" .
cp "$out/serve-bench.csv" "$final/"
