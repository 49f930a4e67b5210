#!/usr/bin/env bash
# GET at pipeline 16: gphash serve (a fresh server, SET at pipeline 16 first, as
# serve-bench.sh does) against redis-server (AOF, appendfsync always), alternated three times,
# with the GPU's SM clock sampled every 200 ms into $OUT/clocks.csv. Needs what serve-bench.sh
# needs (the gphash binary in .gpu-serve/ or GPHASH; redis from .gl-redis/).
set -uo pipefail
root=$(pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. "$root/scripts/redis-tools.sh"
gphash=${GPHASH:-$root/.gpu-serve/gphash}
rate() { # port test pipeline n
  t0=$(date +%s.%N)
  redis-benchmark -p $1 -t $2 -n $4 -c 50 -P $3 -r 1000000 --threads 4 --csv > /dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v n="$4" 'BEGIN { printf "%.0f", n / (b - a) / 1000 }'
}
nvidia-smi --query-gpu=timestamp,clocks.sm --format=csv,noheader -lms 200 > $OUT/clocks.csv &
smi=$!
for round in 1 2 3; do
  rm -rf /dev/shm/redis && mkdir -p /dev/shm/redis
  redis-server --port 6380 --dir /dev/shm/redis --appendonly yes --appendfsync always --save "" --daemonize yes --logfile /tmp/redis.log
  sleep 1
  echo "$(date +%T) redis round $round: SET P16 $(rate 6380 set 16 3000000) GET P16 $(rate 6380 get 16 3000000) $(rate 6380 get 16 3000000) $(rate 6380 get 16 3000000)"
  redis-cli -p 6380 shutdown nosave > /dev/null; sleep 1
  pool=/dev/shm/g.pool; rm -f $pool
  "$gphash" serve $pool --bind 127.0.0.1:6381 --gpu-start wait --batch-wait-us 0 > /tmp/serve.log 2>&1 &
  pid=$!
  until grep -q "listening on" /tmp/serve.log; do sleep 0.2; kill -0 $pid || break; done
  echo "$(date +%T) gphash round $round: SET P16 $(rate 6381 set 16 3000000) GET P16 $(rate 6381 get 16 3000000) $(rate 6381 get 16 3000000) $(rate 6381 get 16 3000000)"
  redis-cli -p 6381 info stats | grep -E "batch_ops_mean|batch_usec_p50|batch_usec_p99" | tr -d '\r' | tr '\n' ' '; echo
  kill -TERM $pid; wait $pid; rm -f $pool
done
kill $smi
