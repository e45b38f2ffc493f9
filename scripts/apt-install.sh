#!/usr/bin/env bash
# Install Debian packages for the project's setup scripts: apt-install.sh WHO PACKAGE...
# WHO prefixes every message (the calling script's name). Runs apt-get update and install
# non-interactively, as root or through sudo; exits 1 with a clear message when it cannot.
set -euo pipefail

who="$1"
shift
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: missing $*, and apt-get is unavailable: install them by hand" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "$who: need root (or sudo) to install: $*" >&2
        exit 1
    fi
fi
echo "$who: installing $* with ${SUDO:+$SUDO }apt-get"
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    || ! $SUDO env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "$@"; then
    echo "$who: apt-get could not install: $*" >&2
    exit 1
fi
