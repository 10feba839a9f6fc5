#!/usr/bin/env bash
# Installs what the tests start: redis-server, ZooKeeper (with Java), Apache Curator with a
# JDK for the Curator interop tests, and PostgreSQL with PgBouncer, from Debian's packages.
# Idempotent: does nothing when they are already present.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)   # joins the Cluster test nodes
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || need+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || need+=(libslf4j-java)
[ -f /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # certificates for the TLS test
# PostgreSQL's server programs live in /usr/lib/postgresql/<version>/bin; the package also
# creates the `postgres` user the tests run them as when they run as root.
{ compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && id postgres >/dev/null 2>&1; } || need+=(postgresql)
command -v pgbouncer >/dev/null 2>&1 || need+=(pgbouncer)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)

if [ ${#need[@]} -eq 0 ]; then
  echo "install-test-deps: redis-server, zookeeper, curator, postgresql and pgbouncer are present"
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
for svc in redis-server zookeeper postgresql pgbouncer; do
  $sudo systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
echo "install-test-deps: done"
