#!/usr/bin/env bash
# The long run of the fault suite, by hand (CI runs a bounded slice, rotating by seed): every
# primitive on every backend, then the replicated topologies, each for SECS seconds (600 by
# default), built with --release, the holders logging at TRACE. Stops at the first run that
# finds a violation. (`--strict-restart` is left out: see docs/TESTING.md.)
#   scripts/soak.sh [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
chaos() {
  echo "== soak: chaos $*"
  cargo run --locked --release --all-features --example chaos -- --trace --secs "$secs" "$@"
}
chaos --backend memory
chaos --backend memory --primitive election
for backend in redis redlock zookeeper postgres; do
  for primitive in mutex write rw multi election permit permits; do
    case "$backend/$primitive" in
      redlock/permit | redlock/permits) continue ;; # Redlock has no semaphores
    esac
    chaos --backend "$backend" --primitive "$primitive"
  done
done
for topology in redis-sentinel redis-cluster zookeeper-ensemble postgres-pgbouncer; do
  chaos --backend "$topology"
  chaos --backend "$topology" --primitive election
done
echo "soak: every run passed (${secs} s each)"
