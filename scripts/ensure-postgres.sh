#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, pg_ctl) are available for the test suite.
# The tests start their own throw-away cluster (tests/pgserver.py); nothing here starts a
# server. Exit 0 when initdb is on PATH or under /usr/lib/postgresql/*/bin; otherwise install
# the distribution's `postgresql` package with apt-get (non-interactive).
set -euo pipefail

find_initdb() {
    if command -v initdb >/dev/null 2>&1; then
        command -v initdb
        return 0
    fi
    local candidate
    # Highest version first.
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$candidate/initdb" ]; then
            echo "$candidate/initdb"
            return 0
        fi
    done
    return 1
}

if found="$(find_initdb)"; then
    echo "ensure-postgres: initdb found at $found"
    exit 0
fi

bash "$(dirname "$0")/apt-install.sh" ensure-postgres postgresql

if found="$(find_initdb)"; then
    echo "ensure-postgres: initdb installed at $found"
    exit 0
fi
echo "ensure-postgres: postgresql installed but initdb still not found" >&2
exit 1
