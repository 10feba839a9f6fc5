#!/usr/bin/env bash
# Every feature builds alone and lints clean: each feature of the `distlock` crate by itself
# (without the default `memory`: a feature that needs another it does not enable fails here),
# then the defaults alone, the combinations the README shows and every pair of backends (memory
# with each of the others among them). A feature with the defaults on adds only `memory`, which
# the pairs cover, so those sets are not built again. clippy -D warnings on the library, the
# binary and the examples each set enables (examples whose required features are off are
# skipped by cargo). Exits non-zero if any set fails, naming each.
set -euo pipefail
cd "$(dirname "$0")/.."

# The [features] table's names, from cargo itself.
mapfile -t features < <(cargo metadata --locked --no-deps --format-version 1 |
  python3 -c 'import json,sys; m=json.load(sys.stdin); p=[p for p in m["packages"] if p["name"]=="distlock"][0]; print("\n".join(sorted(f for f in p["features"] if f!="default")))')

sets=()
for f in "${features[@]}"; do
  sets+=("--no-default-features --features $f")
done
sets+=("--no-default-features" "")
# The feature lines of the README's install section.
sets+=("--no-default-features --features redis-cluster,redis-sentinel"
       "--no-default-features --features redis-deadpool,redis-bb8,redis-tls"
       "--features macros,metrics")
# Every pair of backends.
backends=(memory redis redlock zookeeper postgres)
for ((i = 0; i < ${#backends[@]}; i++)); do
  for ((j = i + 1; j < ${#backends[@]}; j++)); do
    sets+=("--no-default-features --features ${backends[i]},${backends[j]}")
  done
done

n=0
failed=()
for set in "${sets[@]}"; do
  n=$((n + 1))
  echo "== features [$n/${#sets[@]}]: $set"
  # shellcheck disable=SC2086
  cargo clippy --locked -q -p distlock --lib --bins --examples $set -- -D warnings || failed+=("$set")
done
# The examples' package with none of its features: the quickstart and the leader as a user first
# runs them.
echo "== features: the examples' package, no features"
cargo clippy --locked -q -p distlock-examples --examples -- -D warnings || failed+=("-p distlock-examples")
if [ ${#failed[@]} -gt 0 ]; then
  printf 'features: `cargo clippy %s` failed\n' "${failed[@]}" >&2
  exit 1
fi
echo "features: ${#sets[@]} feature sets build and lint clean"
