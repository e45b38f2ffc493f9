#!/usr/bin/env bash
# Make sure nginx and its njs module (libnginx-mod-http-js) are installed for the gateway
# tests (tests/gateway/): they run nginx on loopback, in the foreground, with a config of
# their own. The package must not start the distribution's nginx service (it would
# listen on port 80): a policy-rc.d forbids starting services during the install.
set -euo pipefail

module=/usr/lib/nginx/modules/ngx_http_js_module.so
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    if [ -f "$module" ]; then
        echo "ensure-nginx: nginx and its njs module found"
        exit 0
    fi
fi

policy=/usr/sbin/policy-rc.d
made_policy=""
if [ "$(id -u)" -eq 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    made_policy=1
fi
status=0
bash "$(dirname "$0")/apt-install.sh" ensure-nginx nginx-light libnginx-mod-http-js || status=$?
if [ -n "$made_policy" ]; then
    rm -f "$policy"
fi
exit "$status"
