#!/bin/sh
# Prepares .gpu_carry/ (git-ignored) for the GPU machine: wheels of what its image lacks (Python 3.12, x86-64).
# Run here, then name `.gpu_carry` in the device call's carry and
# start the command with `sh tests/gpu/on_device.sh ...` (see tests/gpu/RESULTS.md for the runs).
#
# The CuTe DSL does not fit one call (its nvidia-cutlass-dsl-libs-cu13 wheel is ~92 MB, over the 64 MiB a call
# carries): `sh tests/gpu/carry.sh dsl` puts it, split, under .gpu_carry_dsl/part1 and part2; carry part1 in one call
# (`sh tests/gpu/on_device.sh stash part1`), then part2 in the next while the machine is still warm; on_device.sh
# joins and installs them when both are there.
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.gpu_carry*/' .git/info/exclude 2>/dev/null || echo '/.gpu_carry*/' >> .git/info/exclude
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
        -d "$1" "$@" 2>&1 | grep -v '^WARNING' || true
}
if [ "${1:-}" = dsl ]; then
    rm -rf .gpu_carry_dsl && mkdir -p .gpu_carry_dsl/part1 .gpu_carry_dsl/part2 /tmp/kernel-lsp-dsl-wheels
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
        -d /tmp/kernel-lsp-dsl-wheels nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 2>&1 | grep -v '^WARNING' || true
    big=$(ls /tmp/kernel-lsp-dsl-wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)
    split -b 48m "$big" ".gpu_carry_dsl/part1/$(basename "$big")."
    mv .gpu_carry_dsl/part1/*.whl.ab .gpu_carry_dsl/part2/
    cp /tmp/kernel-lsp-dsl-wheels/nvidia_cutlass_dsl-*.whl /tmp/kernel-lsp-dsl-wheels/nvidia_cutlass_dsl_libs_base-*.whl \
        /tmp/kernel-lsp-dsl-wheels/nvidia_cutlass_dsl_libs_core-*.whl .gpu_carry_dsl/part2/
    du -sh .gpu_carry_dsl/part1 .gpu_carry_dsl/part2
    exit 0
fi
rm -rf .gpu_carry && mkdir -p .gpu_carry/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
    -d .gpu_carry/wheels pygls lsprotocol cattrs watchdog anthropic distro jiter docstring-parser pydantic \
    pydantic-core annotated-types typing-inspection httpx2 httpcore2 truststore opentelemetry-api sniffio pytest-asyncio pytest-lsp nvidia-cutlass==4.2.0.0 \
    2>&1 | grep -v '^WARNING' || true
# bubblewrap for the candidate's sandbox (the GPU machine has no package registry): its .deb, unpacked there by
# on_device.sh when no bwrap is installed
mkdir -p .gpu_carry/debs && (cd .gpu_carry/debs && apt-get download bubblewrap libcap2 >/dev/null 2>&1) \
    || echo "carry.sh: apt-get download bubblewrap failed: the GPU tests of the sandbox will fail" >&2
du -sh .gpu_carry
