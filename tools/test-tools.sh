#!/bin/sh
# The system tools the tests drive (README's test command runs this first): Neovim 0.7+ and tmux from
# Debian's packages, clangd (the first squiggle in plain .cu files, kernel_lsp/compile/clangd.py) and bubblewrap (the
# candidate's sandbox, kernel_lsp/process/namespaces.py). Installs them with apt-get when they are missing and this runs as root; otherwise says what
# to install and goes on (the tests that need them then skip with that reason, or fail in CI, where CI is set).
missing=""
command -v nvim >/dev/null 2>&1 || missing="$missing neovim"
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
{ command -v clangd || command -v clangd-14 || command -v clangd-16 || command -v clangd-19; } >/dev/null 2>&1 \
    || missing="$missing clangd-14"
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q $missing >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $missing >/dev/null 2>&1; } \
        || echo "tools/test-tools.sh: apt-get could not install$missing; the tests that need them will say so" >&2
else
    echo "tools/test-tools.sh: install$missing (Debian: apt-get install$missing) for the tests" >&2
fi
exit 0
