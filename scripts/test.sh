#!/usr/bin/env bash
# The whole check, as CI runs it: install the test servers, then format, lint, and every test
# (unit, integration against real redis-server, ZooKeeper and PostgreSQL, doctests), then a
# bounded slice of the fault suite (the long run: scripts/soak.sh).
#   scripts/test.sh           everything, as CI
#   scripts/test.sh --quick   the edit-test loop: fmt, clippy, the core and contract tests on
#                             memory and one Redis server (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section's header says when it began, from the start of the run.
phase() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

bash scripts/install-test-deps.sh

if [ "${1:-}" = "--quick" ]; then
  phase "quick: cargo fmt --check, clippy, core and contract tests on memory and Redis"
  cargo fmt --all -- --check
  cargo clippy --locked --workspace --all-targets --all-features -- -D warnings
  export RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}"
  cargo test --locked --all-features -p distlock --lib --test core
  cargo test --locked --all-features -p distlock --test contract -- matrix::memory:: matrix::redis::
  exit 0
fi
# The build of the whole suite takes several GB (see [profile.dev] in Cargo.toml); say what the
# disk has, so that a run that fills it is read as that.
df -h . | sed 's/^/disk: /'

phase "cargo fmt --check"
cargo fmt --all -- --check

phase "cargo clippy"
cargo clippy --locked --workspace --all-targets --all-features -- -D warnings

phase "every feature alone, the defaults, the README's combinations and every pair of backends"
bash scripts/features.sh

phase "release checks: rust-version, docs, publish dry run"
bash scripts/release-check.sh

phase "cargo test"
# Most tests wait on real time (leases running out, failovers, restarts) with the CPU idle: eight
# at a time in each binary, not one per core.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --all-features --workspace 2>&1 | tee "$log"

# One closing line for the whole run (cargo prints one per test binary, the last of which may
# be a crate with no tests).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "distlock: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"

# The fault suite (examples/chaos/): holders looping on one key and writing to a fenced
# resource while faults are injected; it exits non-zero on any violation. A bounded run per
# backend here; the long run of every form and topology is scripts/soak.sh. Built with the
# features the test run unified, so nothing is compiled again.
cargo build --locked --workspace --all-features --example chaos
target_dir=$(cargo metadata --locked --no-deps --format-version 1 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
chaos() { "$target_dir/debug/examples/chaos" "$@"; }
secs="${DISTLOCK_CHAOS_SECS:-16}"
seed="${DISTLOCK_CHAOS_SEED:-$(date +%s)}"
phase "chaos seed $seed (DISTLOCK_CHAOS_SEED=$seed replays the picks below)"
for backend in memory redis redlock zookeeper postgres; do
  # One Redis server: by turns through the holders' proxies (their faults) and straight to the
  # server (its restarts judged without a proxy's delays).
  direct=()
  if [ "$backend" = redis ] && [ $((seed % 2)) = 1 ]; then direct=(--direct); fi
  phase "chaos --backend $backend ${direct[*]:-}"
  chaos --backend "$backend" ${direct[@]+"${direct[@]}"} --secs "$secs"
done
# Elections: leaders taking turns under the same faults and checker, the term the token, with
# the holders logging at TRACE: on memory, and on one of the other backends the seed picks.
election_backends=(redis redlock postgres zookeeper)
for backend in memory "${election_backends[$(( seed % ${#election_backends[@]} ))]}"; do
  phase "chaos --backend $backend --primitive election"
  chaos --backend "$backend" --primitive election --trace --secs "${DISTLOCK_CHAOS_ELECTION_SECS:-12}"
done
# The other primitives, a bounded slice per run: two runs, each a form and a backend the run's
# seed picks (the full matrix by hand, with --backend and --primitive), with the holders
# logging at TRACE. Forms: write (a read-write lock's write side), permit (a one-permit
# semaphore), rw (readers, writers, downgrades), permits (a semaphore of 3, one or two permits
# a holder), multi (two of three keys). Redlock has no semaphores: the permit forms run on the
# other three. The second run gives the holders a 5 s lease (--ttl 5000; about 15 s longer), so
# that what costs a TTL (dead waiters passed over late) stands apart from what costs a handoff
# lease.
topology_seed=$seed
forms=(rw permits multi write permit)
for run in 1 2; do
  primitive="${forms[$(( (seed / 3 + run) % ${#forms[@]} ))]}"
  case "$primitive" in
    permit|permits) backends=(redis zookeeper postgres) ;;
    *) backends=(redis redlock zookeeper postgres) ;;
  esac
  backend="${backends[$(( seed % ${#backends[@]} ))]}"
  seed=$(( seed / 4 + 1 ))
  ttl=$(( run == 2 ? 5000 : 2000 ))
  phase "chaos --backend $backend --primitive $primitive --ttl $ttl (seed $seed)"
  chaos --backend "$backend" --primitive "$primitive" --trace --ttl "$ttl" --seed "$seed" \
    --secs "$secs"
done
# The replicated topologies, one a run, picked by the seed: Redis Sentinel (primary paused or
# killed until the replica is promoted), Redis Cluster (CLUSTER FAILOVER, the lock's primary
# killed for good), a ZooKeeper ensemble with holders on followers (a follower partitioned from
# its clients or from the other servers, the leader killed and restarted) and PostgreSQL
# through PgBouncer (either restarted). Failovers are slow (5 to 15 s each), so a run ends up
# to half a minute past --secs. Every one, for longer: scripts/soak.sh.
topologies=(redis-sentinel redis-cluster zookeeper-ensemble postgres-pgbouncer)
topology="${topologies[$(( topology_seed % ${#topologies[@]} ))]}"
phase "chaos --backend $topology --seed $topology_seed"
chaos --backend "$topology" --seed "$topology_seed" --secs "$secs"
phase "done: every check passed"
