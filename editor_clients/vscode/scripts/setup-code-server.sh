#!/usr/bin/env bash
# Sets up code-server (VS Code in a browser) and playwright-core for the end-to-end test, and prints the folder
# that holds them. Debian's chromium, ripgrep and libkrb5-dev come from apt when missing (needs root).
# The result is cached (KERNEL_LSP_CODE_SERVER_CACHE, else ~/.cache/kernel-lsp/code-server-VERSION): reused when
# complete, rebuilt from scratch otherwise. Nothing is written inside the repository.
set -euo pipefail

CODE_SERVER_VERSION=4.100.3
PLAYWRIGHT_VERSION=1.52.0
CACHE=${KERNEL_LSP_CODE_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kernel-lsp/code-server-$CODE_SERVER_VERSION}
log() { echo "setup-code-server: $*" >&2; }

apt_install() {
    local missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v rg >/dev/null || missing+=(ripgrep)
    [ -e /usr/include/gssapi/gssapi.h ] || missing+=(libkrb5-dev)
    command -v g++ >/dev/null && command -v make >/dev/null || missing+=(build-essential)
    command -v python3 >/dev/null || missing+=(python3)
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        log "missing ${missing[*]}: run 'apt-get install -y ${missing[*]}' as root"
        exit 2
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
}

node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" != 20 ]; then
    log "code-server $CODE_SERVER_VERSION needs Node 20 (this is Node $node_major)"
    exit 2
fi
apt_install

if [ -f "$CACHE/.complete" ]; then
    echo "$CACHE"
    exit 0
fi

work="$CACHE.partial.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
cd "$work"
export npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
log "npm install code-server@$CODE_SERVER_VERSION playwright-core@$PLAYWRIGHT_VERSION in $work"
echo '{"name": "kernel-lsp-code-server", "private": true}' > package.json
npm install --ignore-scripts "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION" >&2

vscode=node_modules/code-server/lib/vscode
log "installing VS Code's own modules"
(cd "$vscode" && npm install --unsafe-perm --omit=dev --ignore-scripts >&2)
mkdir -p "$vscode/node_modules/@vscode/ripgrep/bin"
ln -sf "$(command -v rg)" "$vscode/node_modules/@vscode/ripgrep/bin/rg"
command -v node-gyp >/dev/null || npm install -g node-gyp >&2
log "rebuilding VS Code's native modules"
(cd "$vscode" && npm rebuild --unsafe-perm >&2)
ln -sfn node_modules "$vscode/node_modules.asar"
log "installing the built-in extensions' modules"
(cd "$vscode/extensions" && npm install --unsafe-perm --omit=dev >&2)
log "rebuilding argon2"
npm rebuild argon2 --build-from-source >&2

trap - EXIT
rm -rf "$CACHE"
mv "$work" "$CACHE"
touch "$CACHE/.complete"
echo "$CACHE"
