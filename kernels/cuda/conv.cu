// Convolution-shaped ops: Whisper's conv1d stem and the patchify (im2col) of patch embeddings.
// Host twin: kernels/src/ops/conv.rs.

// x [t_in, c_in] (time-major), w [c_out, c_in, kw], b [c_out] -> out [t_out, c_out],
// out[t, o] = b[o] + sum_{i, r} w[o, i, r] x[t*stride + r - pad, i] (zero outside).
template <typename T>
__device__ void conv1d(const T* x, const T* w, const T* b, T* out, unsigned t_in, unsigned c_in, unsigned t_out,
                       unsigned c_out, unsigned kw, unsigned stride, unsigned pad) {
    const unsigned long long n = (unsigned long long)t_out * c_out;
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; idx < n;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned t = idx / c_out, o = idx % c_out;
        float acc = to_f32(b[o]);
        for (unsigned r = 0; r < kw; ++r) {
            const long long ti = (long long)t * stride + r - pad;
            if (ti < 0 || ti >= t_in) continue;
            const T* xr = x + (unsigned long long)ti * c_in;
            const T* wr = w + (unsigned long long)o * c_in * kw + r;
            for (unsigned i = 0; i < c_in; ++i) acc += to_f32(wr[(unsigned long long)i * kw]) * to_f32(xr[i]);
        }
        out[idx] = from_f32<T>(acc);
    }
}

// images [n, h, w, c] (NHWC) -> patches [n * (h/p) * (w/p), c * p * p], each patch vector in
// (channel, row, column) order, matching a convolution weight [width, c, p, p].
template <typename T>
__device__ void patchify(const T* img, T* out, unsigned n, unsigned h, unsigned w, unsigned c, unsigned p) {
    const unsigned gh = h / p, gw = w / p, len = c * p * p;
    const unsigned long long total = (unsigned long long)n * gh * gw * len;
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; idx < total;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long patch = idx / len;
        const unsigned e = idx % len;
        const unsigned ch = e / (p * p), ky = (e / p) % p, kx = e % p;
        const unsigned img_i = patch / (gh * gw), py = (patch / gw) % gh, px = patch % gw;
        const unsigned long long src = (((unsigned long long)img_i * h + py * p + ky) * w + px * p + kx) * c + ch;
        out[idx] = img[src];
    }
}

// x [t_in, c_in] -> cols [t_out, c_in * kw], cols[t, i * kw + r] = x[t * stride + r - pad, i]
// (zero outside): the im2col of conv1d, in the order of a weight [c_out, c_in, kw].
template <typename T>
__device__ void im2col_1d(const T* x, T* cols, unsigned t_in, unsigned c_in, unsigned t_out, unsigned kw,
                          unsigned stride, unsigned pad) {
    const unsigned len = c_in * kw;
    const unsigned long long n = (unsigned long long)t_out * len;
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; idx < n;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned t = idx / len, e = idx % len, i = e / kw, r = e % kw;
        const long long ti = (long long)t * stride + r - pad;
        cols[idx] = (ti < 0 || ti >= t_in) ? from_f32<T>(0.f) : x[(unsigned long long)ti * c_in + i];
    }
}

#define CONV(T, S)                                                                                    \
    extern "C" __global__ void conv1d_##S(const T* x, const T* w, const T* b, T* out, unsigned t_in,    \
                                          unsigned c_in, unsigned t_out, unsigned c_out, unsigned kw,  \
                                          unsigned stride, unsigned pad) {                             \
        conv1d<T>(x, w, b, out, t_in, c_in, t_out, c_out, kw, stride, pad);                            \
    }                                                                                                 \
    extern "C" __global__ void patchify_##S(const T* img, T* out, unsigned n, unsigned h, unsigned w,   \
                                            unsigned c, unsigned p) {                                  \
        patchify<T>(img, out, n, h, w, c, p);                                                          \
    }                                                                                                 \
    extern "C" __global__ void im2col_1d_##S(const T* x, T* cols, unsigned t_in, unsigned c_in,        \
                                             unsigned t_out, unsigned kw, unsigned stride, unsigned pad) { \
        im2col_1d<T>(x, cols, t_in, c_in, t_out, kw, stride, pad);                                     \
    }
FOR_FLOATS(CONV)
