#!/usr/bin/env bash
# Growth, recovery and opens, on a machine without Rust: `gphash bench resize` of two builds, alternated
# (.gpu-ab/gphash-new.gz and gphash-old.gz, stripped and gzipped), 16 M keys of 8-byte values
# three times each with the debug timings of recovery and growth, then the new build with 100 M
# keys of 128-byte values (a pool of about 20 GB). Results in $OUT.
set -uo pipefail
out=${OUT:-/tmp/out}
root=$(pwd)
mkdir -p "$out" /tmp/ab && cd /tmp/ab || exit 1
for b in new old; do gunzip -c "$root/.gpu-ab/gphash-$b.gz" >gphash-$b && chmod +x gphash-$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
keep='gphash::profile|^[a-z#(]'
for i in 1 2 3; do
  for b in new old; do
    echo "== $b, run $i"
    RUST_LOG=gphash=debug ./gphash-$b bench resize --keys 16777216 2>&1 | grep -E "$keep"
  done
done | tee "$out/resize-16m-ab.txt"
RUST_LOG=gphash=debug ./gphash-new bench resize --keys 100000000 --value-bytes 128 2>&1 | grep -E "$keep" | tee "$out/resize-100m.txt"
