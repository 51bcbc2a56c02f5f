// Row normalizations and softmax: one block per row, f32 accumulation.
// Host twin: kernels/src/ops/norm.rs.

// RMSNorm with (1 + w), Gemma's: x / sqrt(mean(x^2) + eps) * (1 + w).
// Adaptive (w == 0): x / sqrt(mean(x^2) + eps) * (1 + scale) + shift, where the modulation row
// is [scale | shift | gate] (row stride sm; 0 = one row for all).
template <typename T>
__device__ void rms_norm(const T* x, const T* w, const T* mod, T* out, unsigned cols, unsigned long long sx,
                         unsigned long long sm, unsigned long long so, float eps) {
    const unsigned long long row = blockIdx.x;
    const T* xr = x + row * sx;
    float ss = 0.f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_f32(xr[c]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    T* o = out + row * so;
    if (w) {
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x)
            o[c] = from_f32<T>(to_f32(xr[c]) * inv * (1.f + to_f32(w[c])));
    } else {
        const T* m = mod + row * sm;
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x)
            o[c] = from_f32<T>(to_f32(xr[c]) * inv * (1.f + to_f32(m[c])) + to_f32(m[cols + c]));
    }
}

// LayerNorm: (x - mean) / sqrt(var + eps) * w + b (two passes over the row).
template <typename T>
__device__ void layer_norm(const T* x, const T* w, const T* b, T* out, unsigned cols, unsigned long long sx,
                           unsigned long long so, float eps) {
    const unsigned long long row = blockIdx.x;
    const T* xr = x + row * sx;
    float s = 0.f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(xr[c]);
    const float mean = block_sum(s) / cols;
    float v = 0.f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = to_f32(xr[c]) - mean;
        v += d * d;
    }
    const float inv = rsqrtf(block_sum(v) / cols + eps);
    T* o = out + row * so;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x)
        o[c] = from_f32<T>((to_f32(xr[c]) - mean) * inv * to_f32(w[c]) + to_f32(b[c]));
}

template <typename T>
__device__ void softmax(const T* x, T* out, unsigned cols, unsigned long long sx, unsigned long long so) {
    const unsigned long long row = blockIdx.x;
    const T* xr = x + row * sx;
    float m = -INFINITY;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f32(xr[c]));
    m = block_max(m);
    float s = 0.f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) s += expf(to_f32(xr[c]) - m);
    const float inv = 1.f / block_sum(s);
    T* o = out + row * so;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) o[c] = from_f32<T>(expf(to_f32(xr[c]) - m) * inv);
}

#define NORMS(T, S)                                                                                    \
    extern "C" __global__ void rms_norm_##S(const T* x, const T* w, const T* mod, T* out, unsigned cols, \
                                            unsigned long long sx, unsigned long long sm,               \
                                            unsigned long long so, float eps) {                         \
        rms_norm<T>(x, w, mod, out, cols, sx, sm, so, eps);                                            \
    }                                                                                                  \
    extern "C" __global__ void layer_norm_##S(const T* x, const T* w, const T* b, T* out, unsigned cols, \
                                              unsigned long long sx, unsigned long long so, float eps) { \
        layer_norm<T>(x, w, b, out, cols, sx, so, eps);                                                \
    }                                                                                                  \
    extern "C" __global__ void softmax_##S(const T* x, T* out, unsigned cols, unsigned long long sx,     \
                                           unsigned long long so) {                                    \
        softmax<T>(x, out, cols, sx, so);                                                              \
    }
FOR_FLOATS(NORMS)
