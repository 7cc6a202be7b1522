#!/bin/sh
# On the GPU machine, in the project's root: installs .gpu_carry's wheels into /tmp/site (nothing of the image is
# replaced), then runs pytest on the given paths, logging under $OUT.
#   sh tests/gpu/on_device.sh tests/gpu/test_cute_gpu.py tests/gpu/test_agent_gpu.py
#   sh tests/gpu/on_device.sh stash part1     # the CuTe DSL's first half, kept in /tmp until part2 comes
#   sh tests/gpu/on_device.sh exec python3 benchmarks/stated_speedup.py   # any command, in the same set-up
# The order that fits the 64 MiB a call carries: .gpu_carry first (installed into /tmp/site), then part1 (stashed),
# then part2 (joined and installed), each call while the machine is still warm.
set -u
if [ "${1:-}" = stash ]; then
    mkdir -p /tmp/kernel-lsp-dsl && cp .gpu_carry_dsl/"$2"/* /tmp/kernel-lsp-dsl/ && ls -la /tmp/kernel-lsp-dsl
    exit 0
fi
# .gpu_carry (13 MB) and a half of the DSL (~48 MB) do not fit one call beside the tree: a call that carries no
# .gpu_carry uses what an earlier call on the same warm machine installed
if [ -d .gpu_carry/wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu_carry/wheels/*.whl || exit 1
elif [ ! -d /tmp/site/pygls ]; then
    echo "on_device.sh: no .gpu_carry carried and nothing installed in /tmp/site (a fresh machine): carry .gpu_carry" >&2
    exit 1
fi
if [ -d .gpu_carry_dsl/part2 ] && ls /tmp/kernel-lsp-dsl/*.whl.aa >/dev/null 2>&1; then
    cp .gpu_carry_dsl/part2/* /tmp/kernel-lsp-dsl/
    for first in /tmp/kernel-lsp-dsl/*.whl.aa; do cat "${first%.aa}".a? > "${first%.aa}"; done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        /tmp/kernel-lsp-dsl/*.whl || exit 1
fi
# bubblewrap for the candidate's sandbox, from the carried .deb when the image has none (process/namespaces.py)
if ! command -v bwrap >/dev/null 2>&1 && ls .gpu_carry/debs/bubblewrap_*.deb >/dev/null 2>&1; then
    rm -rf /tmp/kernel-lsp-bwrap && for deb in .gpu_carry/debs/*.deb; do dpkg -x "$deb" /tmp/kernel-lsp-bwrap; done
    chmod 755 /tmp/kernel-lsp-bwrap/usr/bin/bwrap
    export KERNEL_LSP_BWRAP=/tmp/kernel-lsp-bwrap/usr/bin/bwrap
    ldconfig -p | grep -q libcap.so.2 || export LD_LIBRARY_PATH="/tmp/kernel-lsp-bwrap/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
# the sandbox's user (uid 65534) reads the checkout and the carried packages
chmod -R o+rX "$PWD" /tmp/site 2>/dev/null
# the DSL's package adds its folder with a .pth file, which PYTHONPATH entries do not read
export PYTHONPATH="$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p "${OUT:-/tmp/out}"
if [ "${1:-}" = exec ]; then
    shift
    exec "$@"
fi
python3 -m pytest -v -p no:cacheprovider "$@" 2>&1 | tee "${OUT:-/tmp/out}/pytest.log"
