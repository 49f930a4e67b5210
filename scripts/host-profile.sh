#!/usr/bin/env bash
# Where a small batch's host time goes, by function: perf with call graphs on batches of 4,096
# gets and inserts (device batches, then host batches), on a machine without a Rust toolchain.
# Needs in .gpu-perf/: gphash.gz (the release binary, not stripped: its symbols) and perf.tgz
# (perf/perf and perf/lib/ with the libraries `ldd /usr/bin/perf` names, from Debian's
# linux-perf). Results in $OUT: each mode's `bench profile` table with and without perf, and
# its stacks (`perf script`, gzipped) for scripts/perf-stacks.py, e.g.
#   scripts/perf-stacks.py device-stacks.txt.gz GpHash::execute_device
set -uo pipefail
out=${OUT:-/tmp/out}
root=$(pwd)
mkdir -p "$out" /tmp/host-profile && cd /tmp/host-profile || exit 1
gunzip -c "$root/.gpu-perf/gphash.gz" >gphash && chmod +x gphash || exit 1
tar xzf "$root/.gpu-perf/perf.tgz" || exit 1
export LD_LIBRARY_PATH=/tmp/host-profile/perf/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for mode in device host; do
  flag=$([ $mode = device ] && echo --device)
  args=(bench profile --keys 1048576 --value-bytes 8 --batches 4096 --reps 50 --rounds 20 --floor-reps 200
    --load-cache --cache-period 1099511627776 $flag)
  ./gphash "${args[@]}" >"$out/$mode-profile.txt" 2>&1
  perf/perf record -F 4000 --call-graph dwarf,16384 -o $mode.data -- ./gphash "${args[@]}" >"$out/$mode-profile-under-perf.txt" 2>&1
  perf/perf script -i $mode.data -F tid,ip,sym 2>/dev/null | gzip >"$out/$mode-stacks.txt.gz"
done
