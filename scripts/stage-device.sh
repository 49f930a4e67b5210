#!/usr/bin/env bash
# Builds the release binaries and packs those that need a GPU into .gpu/gpu.txz (git-ignored)
# for scripts/device.sh on a machine without Rust (the tool that runs it there carries .gpu):
# the gphash binary (crate gphash-cli), the GPU tests of gphash (tests/) and of the baselines
# (gphash-bench, bench/tests/), picked by test target name across the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
rm -rf .gpu && mkdir -p .gpu/bin
cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
keep = {"kernels", "cache", "baseline_slab", "baseline_cpu", "growth", "persistence", "crash_images", "device",
        "kill", "typed", "erase_reinsert", "atomicity", "limits", "inspect", "check", "pipeline", "serve", "beyond_16gib",
        "format", "fill", "gpu_start", "sharded", "profile", "arena_growth", "scoreboard", "suite_runs"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in keep:
        shutil.copy(m["executable"], ".gpu/bin/test-" + m["target"]["name"])
'
cp target/release/gphash .gpu/bin/
# Tests that run the CLI find it where it was built: device.sh puts it there again.
pwd > .gpu/bin/build-root
strip .gpu/bin/test-* .gpu/bin/gphash
# xz: about a third of gzip's size, which keeps the tree a device call carries under 64 MiB.
tar cf - -C .gpu/bin . | xz -T0 -6 > .gpu/gpu.txz && rm -rf .gpu/bin
ls -la .gpu
