#!/usr/bin/env bash
# Runs a stage of the GPU checks and figures on a machine that has no Rust toolchain: the
# binaries come prebuilt in .gpu/gpu.tgz (see scripts/stage-device.sh), results go to $OUT.
#   scripts/device.sh tests      every GPU test binary at the hardware's subgroup size
#   scripts/device.sh figures    load-search, cache figures
#   scripts/device.sh suite ARGS gphash bench suite ARGS (results tarred)
#   scripts/device.sh profile ARGS  gphash bench profile ARGS, one call at a time and pipelined
#   scripts/device.sh large      the cost of the large-pool kernels; a pool past 16 GiB
#   scripts/device.sh hugepages  searches over PCIe with the pool in 4 KiB and in 2 MiB pages
set -uo pipefail
stage=$1; shift
root=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/gph && cd /tmp/gph && tar xzf "$root/.gpu/gpu.tgz"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
case $stage in
tests)
  built=$(cat build-root) && mkdir -p "$built/target/release" && cp gphash "$built/target/release/"
  # The server's tests drive it with redis-cli and redis-benchmark.
  . "$root/scripts/redis-tools.sh"
  for t in kernels cache baseline_slab baseline_cpu growth persistence crash_images device kill typed \
    erase_reinsert atomicity limits inspect check pipeline serve beyond_16gib; do
    echo "== $t"
    ./test-$t 2>&1 | grep -E "test result|FAILED|panicked|GPU tests run|hardware" | sort -u
  done 2>&1 | tee "$out/tests.log"
  ;;
figures)
  ./gphash bench load-search --keys 16777216 --batch 65536 --reps 3 2>&1 | tee "$out/load-search.txt"
  ./gphash bench load-search --keys 16777216 --batch 4096 --reps 3 2>&1 | tee -a "$out/load-search.txt"
  ./gphash bench cache --out /tmp/gph/cache "$@" 2>&1 | tee "$out/cache.txt"
  tar czf "$out/cache.tgz" -C /tmp/gph cache
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
esac
