"""Kernel recording on a real GPU: the profiler sees a load_inline kernel, torch.relu's stock kernel, and streams."""

from __future__ import annotations

import pytest

from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch")]

RELU_CUDA = r"""
#include <ATen/cuda/CUDAContext.h>

namespace candidate {
template <typename T>
__global__ void relu_kernel(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0);
}
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    candidate::relu_kernel<float><<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


@pytest.fixture(scope="module")
def relu_extension():
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="kernel_lsp_recorder_relu", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=RELU_CUDA, functions=["relu"])


def test_profiler_sees_the_candidates_own_kernel_on_the_current_stream(relu_extension) -> None:
    import torch

    from kernel_lsp.candidate.kernels import KernelRecorder, classify, launches_off_stream, own_kernel_names

    x = torch.randn(1 << 20, device="cuda")
    own = own_kernel_names({"relu.cu": RELU_CUDA})
    assert own == {"candidate::relu_kernel"}
    with KernelRecorder("cuda") as seen:
        y = relu_extension.relu(x)
    assert torch.equal(y, torch.relu(x))
    assert seen.how == "profiler" and seen.current_stream is not None
    use = classify(seen.launches, own)
    assert use.custom == ["candidate::relu_kernel"] and use.problem() is None
    assert launches_off_stream(seen.launches, seen.current_stream) == []


def test_stock_relu_is_no_custom_kernel(relu_extension) -> None:
    import torch

    from kernel_lsp.candidate.kernels import KernelRecorder, classify, own_kernel_names

    x = torch.randn(1 << 20, device="cuda")
    with KernelRecorder("cuda") as seen:
        torch.relu(x)
    use = classify(seen.launches, own_kernel_names({"relu.cu": RELU_CUDA}))
    assert use.custom == [] and use.stock and all(name.startswith("at::native::") for name in use.stock)
    assert use.problem().startswith("no custom kernel ran: the candidate's work was all stock kernels (at::native::")


def test_work_on_a_side_stream_is_seen_on_another_stream(relu_extension) -> None:
    import torch

    from kernel_lsp.candidate.kernels import KernelRecorder, kernel_name_of, launches_off_stream

    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    with KernelRecorder("cuda") as seen:
        with torch.cuda.stream(side):
            relu_extension.relu(x)
    hidden = launches_off_stream(seen.launches, seen.current_stream)
    assert [kernel_name_of(launch.name) for launch in hidden] == ["candidate::relu_kernel"]
