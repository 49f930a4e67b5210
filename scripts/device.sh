#!/usr/bin/env bash
# Runs a stage of the GPU checks and figures on a machine that has no Rust toolchain: the
# binaries come prebuilt in .gpu/gpu.txz (see scripts/stage-device.sh), results go to $OUT.
#   scripts/device.sh tests      every GPU test binary at the hardware's subgroup size
#   scripts/device.sh figures    load-search, cache figures
#   scripts/device.sh suite ARGS gphash bench suite ARGS (results tarred)
#   scripts/device.sh profile ARGS  gphash bench profile ARGS, one call at a time and pipelined
#   scripts/device.sh large      the cost of the large-pool kernels; a pool past 16 GiB
#   scripts/device.sh reach      how kernels reach host memory past one binding: windows, a
#                                binding array, device addresses (4 to 64 GiB in windows of 1 GiB,
#                                the engine's on the H200; 16 GiB in windows of 256 MiB; 16 and
#                                64 GiB in transparent huge pages)
#   scripts/device.sh hugepages  searches over PCIe with the pool in 4 KiB and in 2 MiB pages
#   scripts/device.sh past-gpu-memory  a 150 GiB pool on a 256 GiB host, then gphash check
#   scripts/device.sh widths     phase A's tile width per batch against fixed widths
#   scripts/device.sh open       opens after a clean close, waiting for the GPU and in the background
#   scripts/device.sh device-profile  the ceilings, then where device batches' time goes
#   scripts/device.sh side-by-side    every YCSB workload and distribution, gphash against the host maps
#   scripts/device.sh serve-cpu ARGS  the CPU each of the server's threads takes under redis-benchmark
#                                    at pipeline 64, and a perf profile where .gpu/perf/ has perf
#   scripts/device.sh serve-pairs    gphash serve and redis-server (always) in turn, a ratio a pair
#                                    (needs .gl-redis; knobs of scripts/serve-pairs.sh)
#   scripts/device.sh serve-threads  gphash serve against redis-server (always) under redis-benchmark
#                                    with 4, 8 and 16 client threads (needs .gl-redis, .gpu-serve)
#   scripts/device.sh scoreboard ARGS  gphash bench scoreboard ARGS: the regimes G, H and P against
#                                     the best CPU map (results tarred)
#   scripts/device.sh aims PART...  single aims in one build (PART: profile, volatile, pcie, latency,
#                                   alternate, side-by-side), each under a time limit
set -uo pipefail
stage=$1; shift
root=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/gph && cd /tmp/gph && tar xJf "$root/.gpu/gpu.txz"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
case $stage in
tests)
  built=$(cat build-root) && mkdir -p "$built/target/release" && cp gphash "$built/target/release/"
  # The server's tests drive it with redis-cli and redis-benchmark.
  . "$root/scripts/redis-tools.sh"
  for t in kernels cache baseline_slab baseline_cpu growth persistence crash_images device kill typed \
    erase_reinsert atomicity limits inspect check pipeline serve beyond_16gib format fill gpu_start sharded profile \
    arena_growth scoreboard suite_runs; do
    echo "== $t"
    ./test-$t 2>&1 | grep -E "test result|FAILED|panicked|GPU tests run|hardware" | sort -u
  done 2>&1 | tee "$out/tests.log"
  ;;
reach)
  for args in "--mib 4096 --window-mib 1024" "--mib 16384 --window-mib 1024" "--mib 65536 --window-mib 1024" \
    "--mib 16384 --window-mib 256" "--mib 16384 --window-mib 1024 --huge-pages" "--mib 65536 --window-mib 1024 --huge-pages"; do
    echo "== gphash bench reach $args --reps 5"
    RUST_LOG=gphash_bench=info ./gphash bench reach $args --reps 5 2>&1
  done | tee "$out/reach.txt"
  ;;
figures)
  ./gphash bench load-search --keys 16777216 --batch 65536 --reps 3 2>&1 | tee "$out/load-search.txt"
  ./gphash bench load-search --keys 16777216 --batch 4096 --reps 3 2>&1 | tee -a "$out/load-search.txt"
  ./gphash bench cache --out /tmp/gph/cache "$@" 2>&1 | tee "$out/cache.txt"
  tar czf "$out/cache.tgz" -C /tmp/gph cache
  ;;
serve-threads)
  # Is the client the bound at pipeline 64? The same runs with more redis-benchmark threads.
  for threads in 4 8 16; do
    mkdir -p "$out/t$threads"
    (cd "$root" && OUT=$out/t$threads THREADS=$threads FSYNCS=always SCALE=4 REPS=3 LIBRARY_BATCHES= \
      GPHASH=/tmp/gph/gphash bash scripts/serve-bench.sh /dev/shm 2>&1 | tail -3)
  done
  ;;
serve-pairs)
  # gphash serve and redis-server (always) in turn, for each ratio from the same minute (knobs:
  # scripts/serve-pairs.sh).
  (cd "$root" && GPHASH=/tmp/gph/gphash bash scripts/serve-pairs.sh /dev/shm) 2>&1 | tee "$out/serve-pairs.txt"
  ;;
serve-cpu)
  # Where the server's time goes at pipeline 64 (50 clients, 8 client threads; knobs TESTS,
  # CLIENTS, PIPELINE, THREADS, REQUESTS): the cores each of the server's threads and the
  # client kept busy over a run of each test, the host's busy cores, and, where .gpu/perf/
  # holds perf and its libraries, a call-graph profile of the server in the middle of each run
  # (perf-TEST.data, to read against the unstripped binary). ARGS: more serve options.
  . "$root/scripts/redis-tools.sh"
  pool=/dev/shm/serve-cpu.pool
  rm -f "$pool"
  ./gphash serve "$pool" --bind 127.0.0.1:6381 --gpu-start wait "$@" >"$out/serve.log" 2>&1 &
  pid=$!
  until grep -q "listening on" "$out/serve.log"; do sleep 0.2; kill -0 $pid || exit 1; done
  # CPU ticks of the server's threads, summed by thread name; then the host's busy and all ticks.
  ticks() {
    for s in /proc/$pid/task/*/stat; do sed 's/^[0-9]* (\(.*\)) [A-Z] /\1 /' "$s"; done |
      awk '{t[$1] += $12 + $13} END {for (k in t) print k, t[k]}'
    awk '/^cpu / {print "host-busy", $2 + $3 + $4 + $7 + $8 + $9; print "host-all", $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
  }
  for t in ${TESTS:-set get ping_mbulk}; do
    ticks >"$out/before-$t.txt"
    t0=$(date +%s.%N)
    redis-benchmark -p 6381 -t $t -n "${REQUESTS:-20000000}" -c "${CLIENTS:-50}" -P "${PIPELINE:-64}" -r 1000000 --threads "${THREADS:-8}" --csv >"$out/bench-$t.csv" &
    bench=$!
    # The client's own CPU: its ticks sampled while it runs (the first and the last sample).
    (sleep 0.5; while s=$(cat /proc/$bench/stat 2>/dev/null); do
      echo "$(date +%s.%N) $(echo "$s" | sed 's/^[0-9]* (.*) [A-Z] //' | awk '{print $11 + $12}')"; sleep 0.5
    done) >"$out/client-$t.txt" &
    sampler=$!
    if [ -x "$root/.gpu/perf/perf" ]; then
      sleep 2
      LD_LIBRARY_PATH=$root/.gpu/perf/lib "$root/.gpu/perf/perf" record -F 499 -g -p $pid \
        -o "$out/perf-$t.data" -- sleep 2 >/dev/null 2>"$out/perf-$t.log"
    fi
    wait $bench
    t1=$(date +%s.%N)
    ticks >"$out/after-$t.txt"
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
    echo "== $t: $(tail -1 "$out/bench-$t.csv"), wall $wall s"
    wait $sampler
    awk 'NR == 1 {t = $1; c = $2} {u = $1; d = $2} END {if (u > t) printf "  %-20s %6.2f cores\n", "redis-benchmark", (d - c) / 100 / (u - t)}' "$out/client-$t.txt"
    # Cores each thread group kept busy over the run (100 ticks a second).
    join <(sort "$out/before-$t.txt") <(sort "$out/after-$t.txt") |
      awk -v w="$wall" '{printf "  %-20s %6.2f cores\n", $1, ($3 - $2) / 100 / w}'
  done 2>&1 | tee "$out/serve-cpu.txt"
  redis-cli -p 6381 info >"$out/info.txt"
  kill -TERM $pid
  wait $pid
  ;;
profile)
  ./gphash bench profile "$@" 2>&1 | grep -v "imported buffers" | tee "$out/profile.txt"
  ./gphash bench profile --pipeline "$@" 2>&1 | grep -v "imported buffers" | tee "$out/profile-pipelined.txt"
  ;;
large)
  # Alternated runs of the same search with the kernels of small and of large pools.
  for mode in "" --large-pool-mode "" --large-pool-mode; do
    echo "== ${mode:-small-pool kernels}"
    ./gphash bench load-search --keys 16777216 --reps 5 --placements zero-copy --cache-ratio 0 $mode 2>&1
  done | grep -v "imported buffers" | tee "$out/large-mode.txt"
  # The pool the 32-bit kernels refused: 250 M keys of 128-byte values (about 43 GiB).
  mount -o remount,size=110G /dev/shm 2>/dev/null
  df -h /dev/shm
  ./gphash bench load-search --keys 250000000 --value-bytes 128 --batch 1048576 --reps 3 \
    --placements zero-copy --cache-ratio 0 2>&1 | grep -v "imported buffers" | tee "$out/large-pool.txt"
  nvidia-smi --query-gpu=memory.used --format=csv | tee -a "$out/large-pool.txt"
  ;;
hugepages)
  # Does the size of the pool's host pages limit the GPU's random requests? The same searches
  # with the pool on /dev/shm (4 KiB pages there) and on a tmpfs mounted huge=always (2 MiB).
  grep -H . /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled
  mkdir -p /mnt/huge && mount -t tmpfs -o size=110G,huge=always tmpfs /mnt/huge || exit 1
  (while sleep 5; do grep -E "^(ShmemHugePages|Shmem):" /proc/meminfo | tr '\n' ' '; echo; done) \
    > "$out/meminfo.txt" &
  sampler=$!
  for cache in 0 1; do
    for dir in /dev/shm /mnt/huge /dev/shm /mnt/huge; do
      echo "== pool in $dir, cache ratio $cache"
      ./gphash bench load-search --keys 16777216 --value-bytes 128 --reps 3 --placements zero-copy \
        --cache-ratio $cache --pool-dir $dir 2>&1
    done
  done | grep -v "imported buffers" | tee "$out/hugepages-16m.txt"
  ./gphash bench load-search --keys "${LARGE_KEYS:-250000000}" --value-bytes 128 --batch 1048576 --reps 3 \
    --placements zero-copy --cache-ratio 0 --pool-dir /mnt/huge 2>&1 | grep -v "imported buffers" \
    | tee "$out/hugepages-large.txt"
  kill $sampler
  ;;
suite)
  ./gphash bench suite --out /tmp/gph/suite "$@" 2>&1 | grep -v "imported buffers" | tee "$out/suite.txt"
  tar czf "$out/suite.tgz" -C /tmp/gph suite
  ;;
past-gpu-memory)
  # Past one GPU's memory, on a machine with 256 GiB of RAM: 150 M records of 1 KiB values (a heap
  # of 152.6 GiB), loaded, searched and updated under both distributions, the GPU memory in use
  # sampled, then `gphash check` of the kept pool.
  mount -o remount,size=240G /dev/shm && df -h /dev/shm
  (while sleep 2; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | tr '\n' ' '; echo; done) \
    > "$out/smi.txt" 2>&1 &
  sampler=$!
  SECONDS=0
  ./gphash bench suite --key-bytes 8 --value-bytes 1024 --records "${RECORDS:-150000000}" --macro-ops 4194304 \
    --batches 65536 --workloads c,a --distribution uniform,zipf:0.99 --reps 1 --systems gphash-zc \
    --ceiling-mib 0 --keep-pools --pool-dir /dev/shm --out /tmp/gph/large 2>&1 | grep -v "^\[" | tee "$out/large.txt"
  echo "suite: $SECONDS s" | tee -a "$out/large.txt"
  kill $sampler
  awk '{for (i = 2; i <= NF; i += 2) if ($i + 0 > m) m = $i + 0} END {print "most GPU memory in use:", m, "MiB"}' \
    "$out/smi.txt" | tee -a "$out/large.txt"
  pool=$(ls /dev/shm/.tmp*/gphash-zc-8.pool | head -1)
  ls -l "$pool" | tee -a "$out/large.txt"
  SECONDS=0
  ./gphash check "$pool" 2>&1 | tail -4 | tee -a "$out/large.txt"
  echo "check: exit ${PIPESTATUS[0]} in $SECONDS s" | tee -a "$out/large.txt"
  ;;
open)
  # Growth, recovery and opens after a clean close (waiting for the GPU, and
  # with a background start) of 16 M keys of 8-byte values, three runs, then of 100 M keys of
  # 128-byte values (a pool of about 20 GB).
  for i in 1 2 3; do ./gphash bench resize --keys 16777216 2>&1; done | grep -v "imported buffers" | tee "$out/open-16m.txt"
  ./gphash bench resize --keys 100000000 --value-bytes 128 2>&1 | grep -v "imported buffers" | tee "$out/open-100m.txt"
  ;;
device-profile)
  # The volatile table's aims: the device's ceilings and round trips, then device batches
  # (execute_device on a volatile table) profiled kernel by kernel up to 2^22 operations.
  ./gphash bench ceilings 2>&1 | tee "$out/ceilings.txt"
  ./gphash bench profile --device --volatile --keys 16777216 --batches 4096,65536,1048576,4194304 \
    --reps 5 --rounds 2 "$@" 2>&1 | tee "$out/device-profile.txt"
  ;;
side-by-side)
  # The side-by-side table: YCSB A, B, C, D, F (and the load) under both distributions, 128-byte
  # values, gphash (the default cache: every group; no cache; volatile) against the persistent
  # CPU table and the concurrent maps on all host threads; then gphash-zc with the paper's 20%.
  S="--key-bytes 8 --value-bytes 128 --records 16777216 --macro-ops 4194304 --batches 65536 --workloads a,b,c,d,f --distribution uniform,zipf:0.99 --reps 3"
  ./gphash bench suite $S --systems gphash-zc,gphash-host,gphash-nocache,gphash-volatile,cpu,cpu-map \
    --out /tmp/gph/sbs 2>&1 | grep -v "imported buffers" | tee "$out/side-by-side.txt"
  ./gphash bench suite $S --systems gphash-zc --cache-ratio 0.2 --ceiling-mib 0 --out /tmp/gph/sbs02 2>&1 \
    | grep -v "imported buffers" | tee "$out/side-by-side-cache02.txt"
  ;;
scoreboard)
  # The scoreboard: gphash against the best CPU map used plainly, in the regimes G, H and P
  # (ARGS go to `gphash bench scoreboard`: --regimes splits them over calls).
  ./gphash bench scoreboard --out /tmp/gph/sb "$@" 2>&1 | grep -v "imported buffers" | tee "$out/scoreboard.txt"
  tar czf "$out/scoreboard.tgz" -C /tmp/gph sb
  ;;
aims)
  # The performance aims, measured in one build on one machine: each part runs under a time limit
  # so that one part cannot take a whole call. Raw outputs go to $OUT/aims-PART*.txt.
  run() { local part=$1 limit=$2; shift 2; echo "== $part: $*" >>"$out/aims-$part.txt"
    SECONDS=0; timeout "$limit" ./gphash "$@" 2>&1 | grep -v "imported buffers" >>"$out/aims-$part.txt"
    echo "== $part: exit ${PIPESTATUS[0]} in $SECONDS s" | tee -a "$out/aims-$part.txt"; }
  V="--key-bytes 8 --value-bytes 8 --records 16777216 --workloads c --distribution uniform --systems gphash-volatile --reps 5"
  P="--key-bytes 8 --value-bytes 128 --records 16777216 --macro-ops 4194304 --batches 65536 --workloads c,b,a --distribution uniform --systems gphash-nocache --reps 5"
  for part in "$@"; do case $part in
  profile)
    run profile 150 bench profile --keys 16777216 --value-bytes 8 --batches 4096,65536,1048576 --reps 5 --load-cache --cache-period 1099511627776
    run profile 100 bench profile --keys 16777216 --value-bytes 8 --batches 4096,65536,1048576 --reps 5 --device --volatile
    run profile 60 bench profile --keys 16777216 --value-bytes 8 --batches 4096,65536 --reps 5 --device --volatile --pipeline ;;
  volatile)
    run volatile 120 bench suite $V --batches 256,4096 --macro-ops 1048576 --out /tmp/gph/v1
    run volatile 120 bench suite $V --batches 65536,1048576,4194304 --macro-ops 16777216 --ceiling-mib 0 --out /tmp/gph/v2
    run volatile 120 bench suite $V --batches 65536,1048576,4194304 --macro-ops 16777216 --ceiling-mib 0 --in-flight --out /tmp/gph/v3 ;;
  pcie)
    run pcie 120 bench suite $P --out /tmp/gph/p1
    run pcie 120 bench suite $P --ceiling-mib 0 --in-flight --out /tmp/gph/p2 ;;
  latency)
    # Latency against throughput: the batch size is the knob, 128-byte values, the default cache.
    run latency 200 bench suite --key-bytes 8 --value-bytes 128 --records 16777216 --macro-ops 4194304 --workloads c,a \
      --distribution uniform --systems gphash-zc --reps 5 --batches 4096,16384,65536,262144,1048576 --ceiling-mib 0 --out /tmp/gph/l1 ;;
  side-by-side)
    S="--key-bytes 8 --value-bytes 128 --records 16777216 --macro-ops 4194304 --batches 65536 --workloads a,b,c,d,f --reps 5"
    run side-by-side 330 bench suite $S --distribution uniform,zipf:0.99 --systems gphash-zc,gphash-host,cpu-map --ceiling-mib 0 --out /tmp/gph/s1
    run side-by-side 150 bench suite $S --distribution uniform,zipf:0.99 --systems gphash-zc --ceiling-mib 0 --in-flight --out /tmp/gph/s2 ;;
  alternate)
    # The latency aim: batches of 4,096 timed in turn with the bare round trip, kernels
    # untimed: device and host batches on a volatile table, host batches on a zero-copy pool.
    A="--keys 16777216 --batches 4096 --reps 5 --alternate 200"
    run alternate 60 bench profile $A --volatile --device
    run alternate 60 bench profile $A --volatile
    run alternate 90 bench profile $A --value-bytes 128 --load-cache --cache-period 1099511627776 ;;
  *) echo "unknown aims part: $part" >&2; exit 2 ;;
  esac; done
  ;;
widths)
  # Phase A's tile width: the shipped choice per batch against fixed widths (--tile 1, 2 and 4
  # cap it there), volatile C with 8-byte values up to the engine's largest batch.
  for t in 32 4 2 1 32 4 2 1; do
    ./gphash --tile $t bench suite --key-bytes 8 --value-bytes 8 --records 16777216 --macro-ops 8388608 \
      --distribution uniform --ceiling-mib 0 --reps 5 --workloads c --systems gphash-volatile,gphash-staged \
      --batches 65536,1048576,4194304 --out /tmp/gph/widths 2>/dev/null | grep -E "^ *gphash" | sed "s/^/tile $t /"
  done | tee "$out/widths.txt"
  ;;
esac
