// A kernel that spills: 64 floats per thread under a 32-register budget (launch bounds of 1024 threads, 2 blocks
// per SM). kernel-lsp shows its ptxas figures as a code lens and the spill as a warning on the kernel's name.
__global__ void __launch_bounds__(1024, 2) heavy(const float* in, float* out, int n, int j) {
    float acc[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = in[(i * 64 + k) % n];
    float s = 0.f;
    #pragma unroll
    for (int r = 0; r < 8; ++r)
        #pragma unroll
        for (int k = 0; k < 64; ++k) s += acc[k] * acc[(k * 7 + r) & 63] + acc[(k * 13 + r) & 63];
    out[i % n] = s + acc[j & 63];
}
