// A compile error where nvcc puts it: line 5, `y` is not declared.
__global__ void scale(float* p, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = s * y;
}
