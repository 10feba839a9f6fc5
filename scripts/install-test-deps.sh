#!/usr/bin/env bash
# Installs what the tests start: redis-server, ZooKeeper (with Java), and Apache Curator with a
# JDK for the Curator interop tests, from Debian's packages. Idempotent: does nothing when they
# are already present.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || need+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || need+=(libslf4j-java)
[ -f /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # certificates for the TLS test

if [ ${#need[@]} -eq 0 ]; then
  echo "install-test-deps: redis-server, zookeeper and curator are present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-test-deps: run as root to install ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-test-deps: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's packages start system services we do not use; the tests start their own servers.
for svc in redis-server zookeeper; do
  $sudo systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
echo "install-test-deps: done"
