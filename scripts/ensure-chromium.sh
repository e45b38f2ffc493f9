#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the web UI's browser tests (tests/ui/):
# Playwright for Python drives it through its executable path (Playwright's own browser
# download is never used: CI reaches only the package registries).
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "ensure-chromium: $(/usr/bin/chromium --version 2>/dev/null || echo chromium) found"
    exit 0
fi
bash "$(dirname "$0")/apt-install.sh" ensure-chromium chromium fonts-dejavu-core
