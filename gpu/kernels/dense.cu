// The dense executor's kernels (riffle-operators `dense::gpu`), compiled by NVRTC at start.
extern "C" __global__ void gather_f32(const float* data, const long long* idx, float* out,
                                      int width, int total) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int r = t / width, c = t % width;
    out[t] = data[idx[r] * width + c];
}
extern "C" __global__ void binary_f32(const float* a, const float* b, float* out, int op, int total,
                                      int d1, int d2, int d3,
                                      int sa0, int sa1, int sa2, int sa3,
                                      int sb0, int sb1, int sb2, int sb3) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int i3 = t % d3; int r = t / d3;
    int i2 = r % d2; r /= d2;
    int i1 = r % d1; int i0 = r / d1;
    float x = a[i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3];
    float y = b[i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3];
    out[t] = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
}
extern "C" __global__ void unary_f32(const float* x, float* out, int op, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float v = x[t];
    out[t] = op == 0 ? fmaxf(v, 0.0f) : 1.0f / (1.0f + expf(-v));
}
extern "C" __global__ void reduce_inner_f32(const float* x, float* out, int outer, int inner) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer) return;
    float acc = 0.0f;
    for (int j = 0; j < inner; ++j) acc += x[t * inner + j];
    out[t] = acc;
}
extern "C" __global__ void copy_block_f32(const float* src, float* dst, int outer, int chunk,
                                          int dst_chunk, int offset) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * chunk) return;
    int o = t / chunk, c = t % chunk;
    dst[o * dst_chunk + offset + c] = src[t];
}
