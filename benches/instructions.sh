#!/usr/bin/env bash
# User-space instructions per acquisition, distlock beside rslock, in the web shape with 64 tasks
# (issue 29): each impl runs under callgrind for 2 s and for 5 s, and the difference of the
# instruction counts over the difference of the acquisitions leaves out start-up (connecting,
# loading the scripts). Unlike CPU time, the count hardly moves with the machine's load, so it
# tells a change of a few percent in the client's work apart from drift. Callgrind runs the
# threads one at a time, so batches differ from a native run's: read the ratio, not the rate.
#
#   bash benches/instructions.sh [BENCH-BINARY]   # needs valgrind and redis-server
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-$(cargo bench -p distlock-bench --bench contention --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)}
# Prints "<acquisitions> <instructions>" for one impl over `secs` seconds.
run() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" --shape web --web-only "$1" \
    --tasks 64 --keys 100000 --secs "$2" --cold --rounds 1 --svg - 2>&1 |
    python3 -c '
import re, sys
text, secs = sys.stdin.read(), float(sys.argv[1])
rate = float(re.search(r"acq_per_s=([\d.]+)", text).group(1))
print(rate * secs, re.search(r"Collected : (\d+)", text).group(1))' "$2"
}
for impl in distlock rslock; do
  read -r a1 i1 < <(run "$impl" 2)
  read -r a2 i2 < <(run "$impl" 5)
  python3 -c "print('$impl: %.0f instructions per acquisition' % (($i2 - $i1) / ($a2 - $a1)))"
done
