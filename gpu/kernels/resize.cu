// The resize stage's kernels (riffle-operators `resize::gpu`), compiled by NVRTC at start.
// fast_image_resize's u8 fixed point: sum from half a step, shift, clamp.
__device__ __forceinline__ unsigned char clip8(int ss, int precision) {
    int v = ss >> precision;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Per image: source byte offset, source width, temp byte offset, then for the rows and the
// columns axis: taps offset, window, precision. Taps of an axis of n outputs: n starts,
// n counts, n * window weights.
#define META 9

// Vertical pass (first, as fast_image_resize does for u8): dst_h rows at full source width.
extern "C" __global__ void resize_vertical(const unsigned char* src, unsigned char* tmp,
                                           const long long* meta, const int* taps,
                                           int dst_h, int image_base) {
    const long long* m = meta + (long long)(image_base + blockIdx.y) * META;
    long long row_len = m[1] * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= dst_h * row_len) return;
    int y = (int)(t / row_len);
    long long xc = t % row_len;
    const int* axis = taps + m[3];
    int window = (int)m[4], precision = (int)m[5];
    int start = axis[y], count = axis[dst_h + y];
    const int* w = axis + 2 * (long long)dst_h + (long long)y * window;
    const unsigned char* p = src + m[0] + start * row_len + xc;
    int ss = 1 << (precision - 1);
    for (int j = 0; j < count; ++j) ss += (int)p[j * row_len] * w[j];
    tmp[m[2] + t] = clip8(ss, precision);
}

// Horizontal pass of output element t of one image, t counted in the output layout so that
// neighbouring threads write neighbouring elements. Returns the pixel value, sets *c.
__device__ __forceinline__ unsigned char horizontal(const unsigned char* tmp, const long long* m,
                                                    const int* taps, int dst_w, int dst_h,
                                                    int nchw, int t, int* c) {
    int x, y;
    if (nchw) {
        int plane = dst_w * dst_h;
        *c = t / plane;
        int r = t % plane;
        y = r / dst_w;
        x = r % dst_w;
    } else {
        *c = t % 3;
        int px = t / 3;
        y = px / dst_w;
        x = px % dst_w;
    }
    long long row_len = m[1] * 3;
    const int* axis = taps + m[6];
    int window = (int)m[7], precision = (int)m[8];
    int start = axis[x], count = axis[dst_w + x];
    const int* w = axis + 2 * (long long)dst_w + (long long)x * window;
    const unsigned char* p = tmp + m[2] + y * row_len + start * 3 + *c;
    int ss = 1 << (precision - 1);
    for (int j = 0; j < count; ++j) ss += (int)p[j * 3] * w[j];
    return clip8(ss, precision);
}

extern "C" __global__ void resize_horizontal_f32(const unsigned char* tmp, float* out,
                                                 const long long* meta, const int* taps,
                                                 const float* lut, int dst_w, int dst_h,
                                                 int nchw, int image_base) {
    int image = image_base + blockIdx.y;
    int per_image = dst_w * dst_h * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= per_image) return;
    int c;
    unsigned char p = horizontal(tmp, meta + (long long)image * META, taps, dst_w, dst_h, nchw,
                                 (int)t, &c);
    out[(long long)image * per_image + t] = lut[c * 256 + p];
}

extern "C" __global__ void resize_horizontal_u8(const unsigned char* tmp, unsigned char* out,
                                                const long long* meta, const int* taps,
                                                int dst_w, int dst_h, int nchw, int image_base) {
    int image = image_base + blockIdx.y;
    int per_image = dst_w * dst_h * 3;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= per_image) return;
    int c;
    out[(long long)image * per_image + t] =
        horizontal(tmp, meta + (long long)image * META, taps, dst_w, dst_h, nchw, (int)t, &c);
}
