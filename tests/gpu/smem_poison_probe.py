"""An experiment for the GPU machine (issue 22, the part compute-sanitizer cannot do): does shared memory keep what
one kernel wrote into the next kernel's blocks? If it does, a differential check can find a kernel whose output
depends on shared memory it never wrote: fill every SM's shared memory with pattern A, run forward, fill it with
B, run forward again, and compare (after two runs with the same pattern agree, so nondeterminism is not blamed).
Not a test and not a feature: it prints what it saw, so the check is built only on what the hardware does.
Run on an H100 (tests/gpu/RESULTS.md, 2026-12-05, twelfth session): shared memory kept the fill in 100% of the
words, and half the candidate's output followed it; kernel-lsp's shared-init check (profile/shared_init.py) rests
on that.

    python3 tests/gpu/smem_poison_probe.py      # prints a table; exits 0 whatever it finds
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void poison(unsigned pattern, int words) {
    extern __shared__ unsigned s[];
    for (int k = threadIdx.x; k < words; k += blockDim.x) s[k] = pattern;
    __syncthreads();
    if (s[(threadIdx.x * 7) % words] == 0x12345678u && pattern == 0u) s[0] = 1u;  // keep the stores
}

__global__ void peek(unsigned* out) {
    __shared__ unsigned t[1024];  // never written
    for (int k = threadIdx.x; k < 1024; k += blockDim.x) out[blockIdx.x * 1024 + k] = t[k];
}

void fill(int64_t pattern, int64_t bytes, int64_t blocks) {
    cudaFuncSetAttribute(poison, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    poison<<<(int)blocks, 1024, (size_t)bytes, at::cuda::getCurrentCUDAStream()>>>((unsigned)pattern,
                                                                                    (int)(bytes / 4));
}

torch::Tensor look(int64_t blocks) {
    auto out = torch::empty({blocks * 1024}, torch::dtype(torch::kInt32).device(torch::kCUDA));
    peek<<<(int)blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>((unsigned*)out.data_ptr<int>());
    return out;
}
"""

PATTERNS = (0x7FC00001, 0x00000000, 0x5A5A5A5A)
# for the candidate, which returns fmaxf(tile, 0): two positive floats (1.5e16 and 1.0), which ReLU keeps apart
# (a NaN and 0, the first two above, both come out as 0: the first run of this probe saw 0% differ that way)
CANDIDATE_PATTERNS = (0x5A5A5A5A, 0x3F800000)


def main() -> int:
    ext = load_inline(name="kernel_lsp_smem_probe", cpp_sources="void fill(int64_t, int64_t, int64_t);\n"
                      "torch::Tensor look(int64_t);", cuda_sources=SOURCE, functions=["fill", "look"])
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    optin = getattr(props, "shared_memory_per_block_optin", 48 * 1024)
    print(f"{props.name}: {sms} SMs, {optin} bytes of shared memory per block (opt-in)")
    rows = []
    for pattern in PATTERNS:
        ext.fill(pattern, optin, sms * 4)
        seen = ext.look(sms * 2)
        torch.cuda.synchronize()
        signed = pattern - (1 << 32) if pattern >= 1 << 31 else pattern
        share = (seen == signed).float().mean().item()
        rows.append((f"peek after fill 0x{pattern:08x}", f"{share * 100:.1f}% of words hold the pattern"))

    # the candidate of tests/gpu/sanitizer_candidates.py whose tile is half unwritten
    from tests.gpu.sanitizer_candidates import UNINIT_SHARED

    namespace: dict = {}
    exec(compile(UNINIT_SHARED, "uninit_shared.py", "exec"), namespace)
    model = namespace["ModelNew"]().cuda()
    x = namespace["get_inputs"]()[0].cuda()
    outputs = {}
    a, b = CANDIDATE_PATTERNS
    for label, pattern in (("A", a), ("A again", a), ("B", b)):
        ext.fill(pattern, optin, sms * 4)
        outputs[label] = model(x).view(torch.int32)  # bits: a NaN pattern is not equal to itself as a float
        torch.cuda.synchronize()
    same = torch.equal(outputs["A"], outputs["A again"])
    differs = (outputs["A"] != outputs["B"]).float().mean().item()
    rows.append(("uninit_shared: A vs A again", "identical" if same else "differ (nondeterministic)"))
    rows.append(("uninit_shared: A vs B", f"{differs * 100:.1f}% of elements differ"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
