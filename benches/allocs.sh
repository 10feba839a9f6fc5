#!/usr/bin/env bash
# Allocation calls per acquisition, distlock beside rslock, in the web shape with one task
# (issue 29): runs the contention bench under heaptrack and counts the allocations made under
# distlock's frames and under rslock's, divided by each one's acquisitions.
#
#   bash benches/allocs.sh            # needs heaptrack (apt install heaptrack) and redis-server
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo bench -p distlock-bench --bench contention --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
out=$(mktemp -d)
heaptrack -o "$out/ht" "$bin" --shape web --tasks 1 --keys 1000 --secs 3 --rounds 1 \
  --svg "$out/web.svg" | grep -E '^(distlock|rslock)-[a-z-]*web ' | tee "$out/lines"
heaptrack_print -f "$out"/ht.*zst --print-flamegraph "$out/folded" \
  --flamegraph-cost-type allocations > /dev/null
python3 - "$out/folded" "$out/lines" <<'PY'
import collections, sys
calls = collections.Counter()
acquisitions = collections.Counter()
# Each line's acq_per_s over its 3 seconds.
for line in open(sys.argv[2]):
    who = 'rslock' if line.startswith('rslock') else 'distlock'
    rate = dict(f.split('=', 1) for f in line.split()[1:] if '=' in f)['acq_per_s']
    acquisitions[who] += round(float(rate) * 3)
for line in open(sys.argv[1]):
    stack, n = line.rsplit(' ', 1)
    n = int(n)
    if 'warm' in stack:
        continue  # the bench's warm-up, not a measured acquisition
    who = 'rslock' if 'rslock' in stack else 'distlock' if 'distlock' in stack else None
    if who:
        calls[who] += n
for who in ('distlock', 'rslock'):
    if acquisitions[who]:
        print(f"{who}: {calls[who] / acquisitions[who]:.1f} allocation calls per acquisition "
              f"({acquisitions[who]} acquisitions)")
PY
rm -rf "$out"
