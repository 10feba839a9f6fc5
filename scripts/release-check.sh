#!/usr/bin/env bash
# What publishing needs, checked without publishing: the declared rust-version is the real floor
# of the locked dependencies, the documentation builds without a warning (with docs.rs' cfg
# where a nightly toolchain is at hand), and `cargo publish --dry-run` packages and builds both
# crates.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rust-version against the lock file"
cargo metadata --locked --format-version 1 --all-features | python3 -c '
import json, sys
meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
def version(v):
    parts = [int(x) for x in (v or "0").split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
root = next(p for p in meta["packages"] if p["name"] == "distlock")
declared = version(root["rust_version"])
# Everything a user of the crate builds, with every feature: normal and build dependencies.
seen, stack = set(), [root["id"]]
while stack:
    i = stack.pop()
    if i in seen:
        continue
    seen.add(i)
    for dep in nodes[i]["deps"]:
        if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
            stack.append(dep["pkg"])
need = max(seen, key=lambda i: version(packages[i]["rust_version"]))
floor = packages[need]["rust_version"]
name = packages[need]["name"] + " " + packages[need]["version"]
ours = root["rust_version"]
if declared < version(floor):
    sys.exit(f"rust-version {ours} is below what {name} needs: {floor}")
print(f"rust-version {ours}: the locked dependencies need at most {floor} ({name})")
'

echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --all-features -p distlock -p distlock-macros
# Broken links in the internal docs too (they are read in the source).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --all-features -p distlock --document-private-items
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "== cargo +nightly doc, as docs.rs builds it (feature labels on items)"
  RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo +nightly doc --locked --no-deps --all-features -p distlock
fi

echo "== cargo publish --dry-run"
# The tests stay out of the package (they need servers): cargo names each one it leaves out.
cargo publish --dry-run --workspace --locked --allow-dirty 2>&1 | grep -v "is not included in the published package"
