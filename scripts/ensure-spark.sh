#!/usr/bin/env bash
# Make sure what the Spark tests and examples need beyond pip's pyspark is on the machine:
# a Java runtime (`java` on PATH) and the PostgreSQL JDBC driver at /usr/share/java/postgresql.jar.
# The tests start their own throw-away servers (tests/spark/servers.py); nothing here starts
# one. Missing pieces are installed with apt-get (Debian packages default-jre-headless and
# libpostgresql-jdbc-java), as root or through sudo. Quiet and exit 0 when all is present.
set -euo pipefail

# With --java-only (make run), only the Java runtime: the JDBC driver is for the tests.
PG_JDBC_JAR=/usr/share/java/postgresql.jar
JAVA_ONLY=0
if [ "${1:-}" = "--java-only" ]; then
    JAVA_ONLY=1
fi

missing_packages() {
    local packages=()
    if ! command -v java >/dev/null 2>&1; then
        packages+=(default-jre-headless)
    fi
    if [ "$JAVA_ONLY" = 0 ] && [ ! -f "$PG_JDBC_JAR" ]; then
        packages+=(libpostgresql-jdbc-java)
    fi
    echo "${packages[@]}"
}

packages="$(missing_packages)"
if [ -z "$packages" ]; then
    if [ "$JAVA_ONLY" = 0 ]; then
        echo "ensure-spark: java and $PG_JDBC_JAR present"
    fi
    exit 0
fi
echo "ensure-spark: Spark runs on the JVM; installing what is missing: $packages"

# Word splitting of $packages is intended: a space-separated list of package names.
# shellcheck disable=SC2086
bash "$(dirname "$0")/apt-install.sh" ensure-spark $packages

packages="$(missing_packages)"
if [ -n "$packages" ]; then
    echo "ensure-spark: installed, but still missing: $packages" >&2
    exit 1
fi
echo "ensure-spark: java at $(command -v java), JDBC driver at $PG_JDBC_JAR"
