// Row normalizations and softmax: one block per row, f32 accumulation.
// Host twin: kernels/src/ops/norm.rs.
//
// vec8: cols and row strides are multiples of 8 and pointers 16-byte aligned; each thread then
// moves 8 elements per access. ROW_LOOP visits a row in the chosen granularity: `c` is the
// first column of a chunk of `W` values held in `v[]`.

#define ROW_LOOP(PTR, BODY)                                                     \
    if (vec8) {                                                                 \
        for (unsigned c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {     \
            float v[8];                                                         \
            load8((PTR) + c, v);                                                \
            const int W = 8;                                                    \
            BODY                                                                \
        }                                                                       \
    } else {                                                                    \
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {             \
            float v[1] = {to_f32((PTR)[c])};                                    \
            const int W = 1;                                                    \
            BODY                                                                \
        }                                                                       \
    }

template <typename T>
__device__ __forceinline__ void store_w(T* p, const float* v, int w) {
    if (w == 8) store8(p, v);
    else p[0] = from_f32<T>(v[0]);
}
template <typename T>
__device__ __forceinline__ void load_w(const T* p, float* v, int w) {
    if (w == 8) load8(p, v);
    else v[0] = to_f32(p[0]);
}
// load_w of per-column f32 scales, which need not be 16-byte aligned.
__device__ __forceinline__ void load_scales_w(const float* p, float* v, int w) {
    if (w == 8) load8_f32(p, v);
    else v[0] = p[0];
}

// RMSNorm with (1 + w), Gemma's: x / sqrt(mean(x^2) + eps) * (1 + w).
// Adaptive (w == 0): x / sqrt(mean(x^2) + eps) * (1 + scale) + shift, where the modulation row
// is [scale | shift | gate] (row stride sm; 0 = one row for all).
// With a residual (y != 0) the row is first updated in place, x = x + y * g (g row stride sg;
// 0 = one row for all; g == 0: x = x + y), and normalized as stored: the same values as a
// gated_residual launch followed by rms_norm, in one launch.
// With x32 (f32, x's row stride; no residual) the row is first set from it, rounded to T: the
// same values as a cast into x followed by rms_norm. With out32 (f32, out's row stride) the
// output is also written widened from its stored (rounded) values: as a cast of out. With codes
// (E4M3, [rows, cols] contiguous) the stored values are also quantized with the scale
// code_scale[0]: the same codes as quantize_e4m3 of out, in the same launch. With codes, out
// may be null: only the codes are written (of the values out would hold).
// With yp (f32, y's row stride, `parts` blocks sp apart; y == 0) the residual's y is the sum of
// those partial sums in part order, rounded to T: the value a GEMM writing T would have stored.
// With y_scale (f32, [cols]; g unused) the residual is x = x + y * y_scale[c] in f32: the
// product of an FP8 GEMM that left its weight's per-feature scales to its reader.
// PARTS: whether the kernel reads partial sums (yp); without, its registers (and with them how
// many rows an SM holds at once) are only what the other forms need. INFLIGHT: how many parts'
// loads are issued at once after the first's (1 in rms_norm_few, for 2 parts over many rows:
// fewer registers, the same sums in the same order).
template <typename T, bool PARTS, int INFLIGHT = 8>
__device__ void rms_norm(T* x, const T* w, const T* mod, const T* y, const T* g, T* out, unsigned cols,
                         unsigned long long sx, unsigned long long sm, unsigned long long sy, unsigned long long sg,
                         unsigned long long so, float eps, int vec8, const float* x32, float* out32,
                         unsigned char* codes, const float* code_scale, const float* yp, unsigned parts,
                         unsigned long long sp, const float* y_scale) {
    const unsigned long long row = blockIdx.x;
    T* xr = x + row * sx;
    T* o = out ? out + row * so : nullptr;
    float ss = 0.f;
    if (y || (PARTS && yp)) {
        const T* yr = y ? y + row * sy : nullptr;
        const float* ypr = PARTS && yp ? yp + row * sy : nullptr;
        const T* gr = g ? g + row * sg : nullptr;
        // Each thread re-reads only the elements it stored itself.
        ROW_LOOP(xr, {
            float yv[8];
            float gv[8];
            if (PARTS && yp) {
                load_w(ypr + c, yv, W);
                // Up to INFLIGHT parts' loads in flight at once, then added in part order.
                for (unsigned p0 = 1; p0 < parts; p0 += INFLIGHT) {
                    float pv[INFLIGHT][8];
                    // _Pragma: a directive may not stand inside ROW_LOOP's argument.
                    _Pragma("unroll") for (unsigned q = 0; q < INFLIGHT; ++q)
                        if (p0 + q < parts) load_w(ypr + (p0 + q) * sp + c, pv[q], W);
                    _Pragma("unroll") for (unsigned q = 0; q < INFLIGHT; ++q)
                        if (p0 + q < parts)
                            for (int k = 0; k < W; ++k) yv[k] += pv[q][k];
                }
                for (int k = 0; k < W; ++k) yv[k] = to_f32(from_f32<T>(yv[k]));
            } else {
                load_w(yr + c, yv, W);
            }
            if (y_scale) {
                load_scales_w(y_scale + c, gv, W);
            } else if (gr) {
                load_w(gr + c, gv, W);
            } else {
                for (int k = 0; k < W; ++k) gv[k] = 1.f;
            }
            for (int k = 0; k < W; ++k) v[k] += yv[k] * gv[k];
            store_w(xr + c, v, W);
            load_w(xr + c, v, W);
            for (int k = 0; k < W; ++k) ss += v[k] * v[k];
        })
    } else if (x32) {
        const float* x32r = x32 + row * sx;
        ROW_LOOP(x32r, {
            store_w(xr + c, v, W);
            load_w(xr + c, v, W);
            for (int k = 0; k < W; ++k) ss += v[k] * v[k];
        })
    } else {
        ROW_LOOP(xr, for (int k = 0; k < W; ++k) ss += v[k] * v[k];)
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    float* o32 = out32 ? out32 + row * so : nullptr;
    unsigned char* cr = codes ? codes + row * cols : nullptr;
    const float cs = codes ? *code_scale : 1.f;
    if (w) {
        ROW_LOOP(xr, {
            float g8[8];
            load_w(w + c, g8, W);
            for (int k = 0; k < W; ++k) v[k] = v[k] * inv * (1.f + g8[k]);
            if (o) store_w(o + c, v, W);
            if (o32 || cr) {
                // The values out holds (rounded to T).
                for (int k = 0; k < W; ++k) v[k] = to_f32(from_f32<T>(v[k]));
                if (o32) store_w(o32 + c, v, W);
                if (cr) store_codes(cr + c, v, W, cs);
            }
        })
    } else {
        const T* m = mod + row * sm;
        ROW_LOOP(xr, {
            float sc[8];
            float sh[8];
            load_w(m + c, sc, W);
            load_w(m + cols + c, sh, W);
            for (int k = 0; k < W; ++k) v[k] = v[k] * inv * (1.f + sc[k]) + sh[k];
            if (o) store_w(o + c, v, W);
            if (o32 || cr) {
                // The values out holds (rounded to T).
                for (int k = 0; k < W; ++k) v[k] = to_f32(from_f32<T>(v[k]));
                if (o32) store_w(o32 + c, v, W);
                if (cr) store_codes(cr + c, v, W, cs);
            }
        })
    }
}

// LayerNorm: (x - mean) / sqrt(var + eps) * w + b (two passes over the row). With codes (E4M3,
// [rows, cols] contiguous) the stored values are also quantized with the scale code_scale[0]:
// the same codes as quantize_e4m3 of out, in the same launch; out may then be null (only the
// codes are written).
// With a residual (y != 0, row stride sy) the row is first updated in place,
// x = x + (y * y_scale[c] + y_bias[c]) in f32 (either may be null: 1, 0), and normalized as
// stored: the residual of an FP8 GEMM that left its per-feature scales and bias to its reader.
template <typename T>
__device__ void layer_norm(T* x, const T* w, const T* b, T* out, unsigned cols, unsigned long long sx,
                           unsigned long long so, float eps, int vec8, unsigned char* codes,
                           const float* code_scale, const T* y, unsigned long long sy, const float* y_scale,
                           const T* y_bias) {
    const unsigned long long row = blockIdx.x;
    T* xr = x + row * sx;
    T* o = out ? out + row * so : nullptr;
    float s = 0.f;
    if (y) {
        const T* yr = y + row * sy;
        // Each thread re-reads only the elements it stored itself.
        ROW_LOOP(xr, {
            float yv[8];
            load_w(yr + c, yv, W);
            if (y_scale) {
                float sv[8];
                load_scales_w(y_scale + c, sv, W);
                for (int k = 0; k < W; ++k) yv[k] *= sv[k];
            }
            if (y_bias) {
                float bv[8];
                load_w(y_bias + c, bv, W);
                for (int k = 0; k < W; ++k) yv[k] += bv[k];
            }
            for (int k = 0; k < W; ++k) v[k] += yv[k];
            store_w(xr + c, v, W);
            load_w(xr + c, v, W);
            for (int k = 0; k < W; ++k) s += v[k];
        })
    } else {
        ROW_LOOP(xr, for (int k = 0; k < W; ++k) s += v[k];)
    }
    const float mean = block_sum(s) / cols;
    float var = 0.f;
    ROW_LOOP(xr, for (int k = 0; k < W; ++k) var += (v[k] - mean) * (v[k] - mean);)
    const float inv = rsqrtf(block_sum(var) / cols + eps);
    unsigned char* cr = codes ? codes + row * cols : nullptr;
    const float cs = codes ? *code_scale : 1.f;
    ROW_LOOP(xr, {
        float g[8];
        float bb[8];
        load_w(w + c, g, W);
        load_w(b + c, bb, W);
        for (int k = 0; k < W; ++k) v[k] = (v[k] - mean) * inv * g[k] + bb[k];
        if (o) store_w(o + c, v, W);
        if (cr) {
            for (int k = 0; k < W; ++k) v[k] = to_f32(from_f32<T>(v[k]));
            store_codes(cr + c, v, W, cs);
        }
    })
}

template <typename T>
__device__ void softmax(const T* x, T* out, unsigned cols, unsigned long long sx, unsigned long long so, int vec8) {
    const unsigned long long row = blockIdx.x;
    const T* xr = x + row * sx;
    T* o = out + row * so;
    float m = -INFINITY;
    ROW_LOOP(xr, for (int k = 0; k < W; ++k) m = fmaxf(m, v[k]);)
    m = block_max(m);
    float s = 0.f;
    ROW_LOOP(xr, for (int k = 0; k < W; ++k) s += expf(v[k] - m);)
    const float inv = 1.f / block_sum(s);
    ROW_LOOP(xr, {
        for (int k = 0; k < W; ++k) v[k] = expf(v[k] - m) * inv;
        store_w(o + c, v, W);
    })
}

#define NORMS(T, S)                                                                                    \
    extern "C" __global__ void rms_norm_##S(T* x, const T* w, const T* mod, const T* y, const T* g,     \
                                            T* out, unsigned cols, unsigned long long sx,               \
                                            unsigned long long sm, unsigned long long sy,               \
                                            unsigned long long sg, unsigned long long so, float eps,    \
                                            int vec8, const float* x32, float* out32,                   \
                                            unsigned char* codes, const float* code_scale,             \
                                            const float* yp, unsigned parts, unsigned long long sp,    \
                                            const float* y_scale) {                                    \
        pdl_trigger();                                                                                 \
        rms_norm<T, true>(x, w, mod, y, g, out, cols, sx, sm, sy, sg, so, eps, vec8, x32, out32, codes, \
                          code_scale, yp, parts, sp, y_scale);                                         \
    }                                                                                                  \
    /* At most 256 threads a block (row_block); 5 blocks an SM: 48 registers, a wave of 660    \
       rows on 132 SMs (the prefix's 576 at once, where 54 registers gave 4 blocks an SM). */   \
    extern "C" __global__ void __launch_bounds__(256, 5)                                               \
        rms_norm_few_##S(T* x, const T* w, const T* mod, const T* y, const T* g, T* out, unsigned cols, \
                         unsigned long long sx, unsigned long long sm, unsigned long long sy,          \
                         unsigned long long sg, unsigned long long so, float eps, int vec8,            \
                         const float* x32, float* out32, unsigned char* codes,                         \
                         const float* code_scale, const float* yp, unsigned parts,                     \
                         unsigned long long sp, const float* y_scale) {                                \
        pdl_trigger();                                                                                 \
        rms_norm<T, true, 1>(x, w, mod, y, g, out, cols, sx, sm, sy, sg, so, eps, vec8, x32, out32,   \
                             codes, code_scale, yp, parts, sp, y_scale);                               \
    }                                                                                                  \
    extern "C" __global__ void rms_norm_plain_##S(T* x, const T* w, const T* mod, const T* y,           \
                                                  const T* g, T* out, unsigned cols,                   \
                                                  unsigned long long sx, unsigned long long sm,         \
                                                  unsigned long long sy, unsigned long long sg,         \
                                                  unsigned long long so, float eps, int vec8,           \
                                                  const float* x32, float* out32,                       \
                                                  unsigned char* codes, const float* code_scale,       \
                                                  const float* yp, unsigned parts,                      \
                                                  unsigned long long sp, const float* y_scale) {        \
        pdl_trigger();                                                                                 \
        rms_norm<T, false>(x, w, mod, y, g, out, cols, sx, sm, sy, sg, so, eps, vec8, x32, out32,      \
                           codes, code_scale, nullptr, 0, 0, y_scale);                                 \
    }                                                                                                  \
    extern "C" __global__ void layer_norm_##S(T* x, const T* w, const T* b, T* out, unsigned cols,       \
                                              unsigned long long sx, unsigned long long so, float eps,  \
                                              int vec8, unsigned char* codes, const float* code_scale,  \
                                              const T* y, unsigned long long sy, const float* y_scale,  \
                                              const T* y_bias) {                                        \
        layer_norm<T>(x, w, b, out, cols, sx, so, eps, vec8, codes, code_scale, y, sy, y_scale, y_bias); \
    }                                                                                                  \
    extern "C" __global__ void softmax_##S(const T* x, T* out, unsigned cols, unsigned long long sx,     \
                                           unsigned long long so, int vec8) {                          \
        softmax<T>(x, out, cols, sx, so, vec8);                                                        \
    }
FOR_FLOATS(NORMS)

// Greedy decoding's reduction: per row of f32 logits plus an optional additive mask (0 or
// -inf per column), the index of the maximum (the first on ties) and its log-softmax value.
extern "C" __global__ void argmax_logsoftmax(const float* logits, const float* mask, int* index, float* logprob,
                                             unsigned cols, unsigned long long sx) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const unsigned long long row = blockIdx.x;
    const float* x = logits + row * sx;
    float m = -INFINITY;
    int mi = 0x7fffffff;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = x[c] + (mask ? mask[c] : 0.f);
        if (v > m) { m = v; mi = (int)c; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, m, o);
        const int oi = __shfl_xor_sync(0xffffffffu, mi, o);
        if (ov > m || (ov == m && oi < mi)) { m = ov; mi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) { best_v[warp] = m; best_i[warp] = mi; }
    __syncthreads();
    m = lane < warps ? best_v[lane] : -INFINITY;
    mi = lane < warps ? best_i[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, m, o);
        const int oi = __shfl_xor_sync(0xffffffffu, mi, o);
        if (ov > m || (ov == m && oi < mi)) { m = ov; mi = oi; }
    }
    float s = 0.f;
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = x[c] + (mask ? mask[c] : 0.f);
        s += expf(v - m);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        index[row] = mi;
        logprob[row] = -logf(s);
    }
}
