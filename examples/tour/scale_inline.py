"""CUDA inside Python: kernel-lsp compiles the load_inline strings as torch would and puts nvcc's messages and
ptxas figures on these lines."""
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void scale_kernel(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

void scale(torch::Tensor x, double s) {
    scale_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), (float)s, (int)x.numel());
}
"""

ext = load_inline(name="tour_scale", cpp_sources="void scale(torch::Tensor x, double s);",
                  cuda_sources=cuda_source, functions=["scale"])
