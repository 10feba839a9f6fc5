#!/usr/bin/env bash
# The whole check, as CI runs it: install the test servers, then format, lint, and every test
# (unit, integration against real redis-server and ZooKeeper, doctests).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --locked --all-targets --all-features -- -D warnings

echo "== cargo test"
cargo test --locked --all-features --workspace
