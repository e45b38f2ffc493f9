#!/usr/bin/env bash
# Make sure what the Spark tests and examples need beyond pip's pyspark is on the machine:
# a Java runtime (`java` on PATH) and the PostgreSQL JDBC driver at /usr/share/java/postgresql.jar.
# The tests start their own throw-away servers (tests/spark/servers.py); nothing here starts
# one. Missing pieces are installed with apt-get (Debian packages default-jre-headless and
# libpostgresql-jdbc-java), as root or through sudo. Quiet and exit 0 when all is present.
set -euo pipefail

PG_JDBC_JAR=/usr/share/java/postgresql.jar

missing_packages() {
    local packages=()
    if ! command -v java >/dev/null 2>&1; then
        packages+=(default-jre-headless)
    fi
    if [ ! -f "$PG_JDBC_JAR" ]; then
        packages+=(libpostgresql-jdbc-java)
    fi
    echo "${packages[@]}"
}

packages="$(missing_packages)"
if [ -z "$packages" ]; then
    echo "ensure-spark: java and $PG_JDBC_JAR present"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-spark: missing $packages and apt-get is unavailable;" \
         "install a Java runtime and the PostgreSQL JDBC driver by hand" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "ensure-spark: need root (or sudo) to install: $packages" >&2
        exit 1
    fi
fi

echo "ensure-spark: installing $packages with ${SUDO:+$SUDO }apt-get"
# Word splitting of $packages is intended: it is a space-separated list of package names.
# shellcheck disable=SC2086
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    || ! $SUDO env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends $packages; then
    echo "ensure-spark: apt-get could not install: $packages" >&2
    exit 1
fi

packages="$(missing_packages)"
if [ -n "$packages" ]; then
    echo "ensure-spark: installed, but still missing: $packages" >&2
    exit 1
fi
echo "ensure-spark: java at $(command -v java), JDBC driver at $PG_JDBC_JAR"
