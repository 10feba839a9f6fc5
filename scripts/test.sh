#!/usr/bin/env bash
# The whole check, as CI runs it: install the test servers, then format, lint, and every test
# (unit, integration against real redis-server, ZooKeeper and PostgreSQL, doctests).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
# The build of the whole suite takes several GB (see [profile.dev] in Cargo.toml); say what the
# disk has, so that a run that fills it is read as that.
df -h . | sed 's/^/disk: /'

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets --all-features -- -D warnings

echo "== every feature alone, with and without the defaults, and the README's combinations"
bash scripts/features.sh

echo "== release checks: rust-version, docs, publish dry run"
bash scripts/release-check.sh

echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --all-features --workspace 2>&1 | tee "$log"

# One closing line for the whole run (cargo prints one per test binary, the last of which may
# be a crate with no tests).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "distlock: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"

# The fault suite (examples/chaos/): holders looping on one key and writing to a fenced
# resource while faults are injected; it exits non-zero on any violation. A bounded run per
# backend here; run it for longer by hand (`--secs 600`, `--release`).
for backend in memory redis redlock zookeeper postgres; do
  echo "== chaos --backend $backend"
  cargo run --locked --all-features --example chaos -- --backend "$backend" --secs "${DISTLOCK_CHAOS_SECS:-45}"
done
# Elections (issue 30): leaders taking turns under the same faults and checker, the term the
# token, with the holders logging at TRACE, on every backend that has them.
for backend in memory redis redlock postgres zookeeper; do
  echo "== chaos --backend $backend --primitive election"
  cargo run --locked --all-features --example chaos -- --backend "$backend" --primitive election \
    --trace --secs "${DISTLOCK_CHAOS_ELECTION_SECS:-25}"
done
# The other primitives, a bounded slice per run: two runs, each a form and a backend the run's
# seed picks (the full matrix by hand, with --backend and --primitive), with the holders
# logging at TRACE. Forms: write (a read-write lock's write side), permit (a one-permit
# semaphore), rw (readers, writers, downgrades), permits (a semaphore of 3, one or two permits
# a holder), multi (two of three keys). Redlock has no semaphores: the permit forms run on the
# other three. The second run gives the holders a 5 s lease (--ttl 5000; about 15 s longer), so
# that what costs a TTL (dead waiters passed over late) stands apart from what costs a handoff
# lease.
seed="${DISTLOCK_CHAOS_SEED:-$(date +%s)}"
echo "== chaos seed $seed (DISTLOCK_CHAOS_SEED=$seed replays these picks)"
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
  echo "== chaos --backend $backend --primitive $primitive --ttl $ttl (seed $seed)"
  cargo run --locked --all-features --example chaos -- --backend "$backend" --primitive "$primitive" \
    --trace --ttl "$ttl" --seed "$seed" --secs "${DISTLOCK_CHAOS_SECS:-45}"
done
# The replicated topologies, one a run, picked by the seed: Redis Sentinel (primary paused or
# killed until the replica is promoted), Redis Cluster (CLUSTER FAILOVER, the lock's primary
# killed for good), a ZooKeeper ensemble with holders on followers (a follower partitioned from
# its clients or from the other servers, the leader killed and restarted) and PostgreSQL
# through PgBouncer (either restarted). Failovers are slow (5 to 15 s each), so a run ends up
# to half a minute past --secs. Every one by hand:
#   for b in redis-sentinel redis-cluster zookeeper-ensemble postgres-pgbouncer; do
#     cargo run --release --all-features --example chaos -- --backend "$b" --secs 600 || break
#   done
topologies=(redis-sentinel redis-cluster zookeeper-ensemble postgres-pgbouncer)
topology="${topologies[$(( topology_seed % ${#topologies[@]} ))]}"
echo "== chaos --backend $topology --seed $topology_seed"
cargo run --locked --all-features --example chaos -- --backend "$topology" --seed "$topology_seed" \
  --secs "${DISTLOCK_CHAOS_SECS:-45}"
