#!/usr/bin/env python3
"""Shares of on-CPU time under one function, from `perf script -F tid,ip,sym` output (gzipped)
of a run recorded with call graphs (scripts/host-profile.sh).

    scripts/perf-stacks.py STACKS.txt.gz FUNCTION [TOP]

Keeps the samples whose stack holds FUNCTION and prints, over them, the TOP (70) largest
inclusive shares (the samples a function is on the stack of, counted once per sample, between
the leaf and FUNCTION) and the TOP largest leaves' (self) shares."""
import collections
import gzip
import sys

path, target = sys.argv[1], sys.argv[2]
top = int(sys.argv[3]) if len(sys.argv) > 3 else 70
samples, cur = [], None
for line in gzip.open(path, "rt", errors="replace"):
    if not line.strip() or line.strip().isdigit():
        if cur:
            samples.append(cur)
        cur = [] if line.strip() else None
        continue
    if cur is not None:
        parts = line.strip().split(None, 1)
        cur.append((parts[1] if len(parts) > 1 else parts[0]).replace(" (inlined)", ""))
if cur:
    samples.append(cur)
under = [s for s in samples if any(target in f for f in s)]
print(f"{len(samples)} samples, {len(under)} under {target}")
inclusive, leaves = collections.Counter(), collections.Counter()
for s in under:
    outer = max(i for i, f in enumerate(s) if target in f)
    inclusive.update(set(s[: outer + 1]))
    leaves[s[0]] += 1
n = len(under) or 1
print("== inclusive")
for f, c in inclusive.most_common(top):
    print(f"{100 * c / n:6.1f}%  {f[:150]}")
print("== self")
for f, c in leaves.most_common(top):
    print(f"{100 * c / n:6.1f}%  {f[:150]}")
