#!/usr/bin/env bash
# How many of the client's allocations would miss glibc's per-thread cache (tcache), distlock
# beside rslock, in the web shape with 64 tasks (issue 29): benches/tcache/shim.c, preloaded
# into the bench, models the cache per thread and counts 2 s of the run. A block freed when its
# size's cache is full goes to the allocator's shared lists, and a later allocation of that size
# takes the slow path; many tasks each holding blocks across a round trip, and a task freeing a
# batch's blocks at once, are what fill it. Read the rate; the run's load moves the counts.
#
#   bash benches/cache-misses.sh [BENCH-BINARY]   # needs a C compiler and redis-server
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-$(cargo bench -p distlock-bench --bench contention --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cc -O2 -shared -fPIC -o "$dir/shim.so" benches/tcache/shim.c -ldl -lpthread
for impl in distlock rslock; do
  SHIM_OUT="$dir/$impl.txt" LD_PRELOAD="$dir/shim.so" "$bin" --shape web --web-only "$impl" \
    --tasks 64 --keys 100000 --secs 6 --cold --rounds 1 --svg - >/dev/null 2>&1
  awk -v impl="$impl" '{a += $4; m += $6} END {
    printf "%s: %.1f %% of %d allocations miss the per-thread cache\n", impl, 100 * m / a, a }' \
    "$dir/$impl.txt"
done
