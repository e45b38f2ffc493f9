#!/usr/bin/env bash
# Make sure HAProxy (with Lua, as Debian builds it) is installed for the gateway tests
# (tests/gateway/): they run it on loopback in front of stub servers. Nothing is started here.
set -euo pipefail

for candidate in "$(command -v haproxy 2>/dev/null || true)" /usr/sbin/haproxy; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        echo "ensure-haproxy: haproxy found at $candidate"
        exit 0
    fi
done

bash "$(dirname "$0")/apt-install.sh" ensure-haproxy haproxy
