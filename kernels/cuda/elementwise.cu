// Elementwise ops. Host twin: kernels/src/ops/elementwise.rs.

// Unary ops, contiguous, n elements: 0 silu, 1 gelu (tanh), 2 gelu (erf), 3 scale by alpha.
__device__ __forceinline__ float unary_f32(int op, float v, float alpha) {
    switch (op) {
        case 0: return v / (1.f + expf(-v));
        case 1: return gelu_tanh(v);
        case 2: return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
        default: return alpha * v;
    }
}

// vec8: n is a multiple of 8 and both pointers are 16-byte aligned. With `codes` (E4M3, n,
// contiguous): also e4m3(stored out / code_scale[0]), the codes quantize_e4m3 of out gives, in
// the same launch.
template <typename T>
__device__ void unary(const T* x, T* out, unsigned long long n, int op, float alpha, int vec8,
                      unsigned char* codes, const float* code_scale) {
    const unsigned long long start = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    const float cs = codes ? *code_scale : 1.f;
    if (vec8) {
        for (unsigned long long g = start; g < n / 8; g += step) {
            float v[8];
            load8(x + g * 8, v);
            for (int k = 0; k < 8; ++k) v[k] = unary_f32(op, v[k], alpha);
            store8(out + g * 8, v);
            if (codes) {
                for (int k = 0; k < 8; ++k) v[k] = to_f32(from_f32<T>(v[k]));
                store_codes(codes + g * 8, v, 8, cs);
            }
        }
        return;
    }
    for (unsigned long long i = start; i < n; i += step) {
        const T v = from_f32<T>(unary_f32(op, to_f32(x[i]), alpha));
        out[i] = v;
        if (codes) codes[i] = e4m3_from_f32(to_f32(v) / cs);
    }
}

// Binary ops over rows × cols with row strides (b's row stride 0 = one row broadcast):
// 0: a + alpha * b, 1: a * b, 2: gelu_tanh(a) * b, 3: gelu_tanh(a + b).
__device__ __forceinline__ float binary_f32(int op, float x, float y, float alpha) {
    switch (op) {
        case 0: return x + alpha * y;
        case 1: return x * y;
        case 2: return gelu_tanh(x) * y;
        default: return gelu_tanh(x + y);
    }
}

// vec8: cols and every row stride are multiples of 8, pointers 16-byte aligned. With `codes`
// (E4M3, rows × cols, contiguous): also e4m3(stored out / code_scale[0]), the codes
// quantize_e4m3 of out gives, in the same launch. With `a_scale` or `b_scale` (f32, one per
// column; either may be null): a or b is first multiplied by its column's scale, in f32 (the
// per-feature weight scales an FP8 GEMM left to its consumer). `out` may be null when codes are
// given: the codes are then all that is written (of the values out would have stored).
template <typename T>
__device__ void binary(const T* a, const T* b, T* out, unsigned rows, unsigned cols, unsigned long long sa,
                       unsigned long long sb, unsigned long long so, int op, float alpha, int vec8,
                       unsigned char* codes, const float* code_scale, const float* a_scale,
                       const float* b_scale) {
    const unsigned long long start = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    const float cs = codes ? *code_scale : 1.f;
    if (vec8) {
        const unsigned g_cols = cols / 8;
        const unsigned long long n = (unsigned long long)rows * g_cols;
        for (unsigned long long g = start; g < n; g += step) {
            // A 32-bit division where the index fits (a 64-bit one is a long subroutine).
            const unsigned long long r = n <= 0xffffffffull ? (unsigned)g / g_cols : g / g_cols;
            const unsigned long long c = (g - r * g_cols) * 8;
            float x[8], y[8];
            load8(a + r * sa + c, x);
            load8(b + r * sb + c, y);
            float sc[8];
            if (a_scale) {
                load8_f32(a_scale + c, sc);
                for (int k = 0; k < 8; ++k) x[k] *= sc[k];
            }
            if (b_scale) {
                load8_f32(b_scale + c, sc);
                for (int k = 0; k < 8; ++k) y[k] *= sc[k];
            }
            for (int k = 0; k < 8; ++k) x[k] = binary_f32(op, x[k], y[k], alpha);
            if (out) store8(out + r * so + c, x);
            if (codes) {
                for (int k = 0; k < 8; ++k) x[k] = to_f32(from_f32<T>(x[k]));
                store_codes(codes + r * cols + c, x, 8, cs);
            }
        }
        return;
    }
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = start; i < n; i += step) {
        unsigned long long r = i / cols, c = i % cols;
        const float x = to_f32(a[r * sa + c]) * (a_scale ? a_scale[c] : 1.f);
        const float y = to_f32(b[r * sb + c]) * (b_scale ? b_scale[c] : 1.f);
        const T v = from_f32<T>(binary_f32(op, x, y, alpha));
        if (out) out[r * so + c] = v;
        if (codes) codes[i] = e4m3_from_f32(to_f32(v) / cs);
    }
}

// out = x + y * gate (gate row stride 0 = one row broadcast).
template <typename T>
__device__ void gated_residual(const T* x, const T* y, const T* gate, T* out, unsigned rows, unsigned cols,
                               unsigned long long sx, unsigned long long sy, unsigned long long sg,
                               unsigned long long so, int vec8) {
    const unsigned long long start = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    if (vec8) {
        const unsigned g_cols = cols / 8;
        const unsigned long long n = (unsigned long long)rows * g_cols;
        for (unsigned long long g = start; g < n; g += step) {
            const unsigned long long r = g / g_cols, c = (g % g_cols) * 8;
            float xv[8], yv[8], gv[8];
            load8(x + r * sx + c, xv);
            load8(y + r * sy + c, yv);
            load8(gate + r * sg + c, gv);
            for (int k = 0; k < 8; ++k) xv[k] += yv[k] * gv[k];
            store8(out + r * so + c, xv);
        }
        return;
    }
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = start; i < n; i += step) {
        unsigned long long r = i / cols, c = i % cols;
        out[r * so + c] = from_f32<T>(to_f32(x[r * sx + c]) + to_f32(y[r * sy + c]) * to_f32(gate[r * sg + c]));
    }
}

template <typename S, typename D>
__device__ void cast(const S* x, D* out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = from_f32<D>(to_f32(x[i]));
}

// One Euler step of flow matching in f32, x <- x + dt * v, also writing the new x in T (the
// next step's input).
template <typename T>
__device__ void euler_step_cast(float* x, const float* v, T* x_cast, unsigned long long n, float dt) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float y = x[i] + dt * v[i];
        x[i] = y;
        x_cast[i] = from_f32<T>(y);
    }
}

// The Euler update with a frozen prefix (real-time chunking's hard mask): rows below the count
// (read here, so a captured graph takes a new count) are set to the flow's interpolation at
// t_next between the noise x1 and the frozen actions.
template <typename T>
__device__ void euler_step_inpaint_cast(float* x, const float* v, T* x_cast, unsigned long long n, float dt,
                                        const float* x1, const float* frozen, const int* frozen_rows,
                                        unsigned row_len, float t_next) {
    const int rows = *frozen_rows;
    unsigned long long frozen_n = rows > 0 ? (unsigned long long)rows * row_len : 0ull;
    if (frozen_n > n) frozen_n = n;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float y = x[i] + dt * v[i];
        if (i < frozen_n) y = t_next * x1[i] + (1.0f - t_next) * frozen[i];
        x[i] = y;
        x_cast[i] = from_f32<T>(y);
    }
}

// Flow matching's velocity and Euler update in one launch (the action expert's output
// projection: few outputs, a long reduction): v = h·wᵀ + b in f32, then x ← x + dt·v as
// euler_step (x_cast null), euler_step_cast (x_cast given) or euler_step_inpaint_cast
// (frozen_rows given too). h [rows, k] (row stride sh), w [n, k] and b [n], v, x and x_cast
// [rows, n], all contiguous. Block (row, 8 outputs), a warp per output: its lanes' partial
// sums (4 consecutive columns an access with vec4: k a multiple of 4, h, sh and w aligned to
// 16 bytes) added by warp_sum.
template <typename T>
__device__ void velocity_euler(const float* h, unsigned long long sh, const float* w, const float* b, float* v,
                               float* x, unsigned n, unsigned k, float dt, T* x_cast, const float* x1,
                               const float* frozen, const int* frozen_rows, float t_next, int vec4) {
    const unsigned r = blockIdx.x, j = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (j >= n) return;
    const float* hr = h + r * sh;
    const float* wj = w + (unsigned long long)j * k;
    float acc = 0.f;
    if (vec4) {
#pragma unroll 4
        for (unsigned c = lane * 4; c < k; c += 128) {
            const float4 a = *(const float4*)(hr + c), q = *(const float4*)(wj + c);
            acc += a.x * q.x + a.y * q.y + a.z * q.z + a.w * q.w;
        }
    } else {
        for (unsigned c = lane; c < k; c += 32) acc += hr[c] * wj[c];
    }
    acc = warp_sum(acc);
    if (lane != 0) return;
    const unsigned long long i = (unsigned long long)r * n + j;
    const float vi = acc + b[j];
    v[i] = vi;
    float y = x[i] + dt * vi;
    if (frozen_rows && (int)r < *frozen_rows) y = t_next * x1[i] + (1.0f - t_next) * frozen[i];
    x[i] = y;
    if (x_cast) x_cast[i] = from_f32<T>(y);
}

#define ELEMENTWISE(T, S)                                                                              \
    extern "C" __global__ void unary_##S(const T* x, T* out, unsigned long long n, int op, float alpha,  \
                                         int vec8, unsigned char* codes, const float* code_scale) {     \
        unary<T>(x, out, n, op, alpha, vec8, codes, code_scale);                                       \
    }                                                                                                  \
    extern "C" __global__ void binary_##S(const T* a, const T* b, T* out, unsigned rows, unsigned cols,  \
                                          unsigned long long sa, unsigned long long sb,                \
                                          unsigned long long so, int op, float alpha, int vec8,        \
                                          unsigned char* codes, const float* code_scale,               \
                                          const float* a_scale, const float* b_scale) {                \
        binary<T>(a, b, out, rows, cols, sa, sb, so, op, alpha, vec8, codes, code_scale, a_scale,      \
                  b_scale);                                                                            \
    }                                                                                                  \
    extern "C" __global__ void gated_residual_##S(const T* x, const T* y, const T* g, T* out,           \
                                                  unsigned rows, unsigned cols, unsigned long long sx, \
                                                  unsigned long long sy, unsigned long long sg,        \
                                                  unsigned long long so, int vec8) {                   \
        gated_residual<T>(x, y, g, out, rows, cols, sx, sy, sg, so, vec8);                             \
    }                                                                                                  \
    extern "C" __global__ void cast_f32_##S(const float* x, T* out, unsigned long long n) {            \
        cast<float, T>(x, out, n);                                                                     \
    }                                                                                                  \
    extern "C" __global__ void cast_bf16_##S(const bf16* x, T* out, unsigned long long n) {            \
        cast<bf16, T>(x, out, n);                                                                      \
    }                                                                                                  \
    extern "C" __global__ void cast_f16_##S(const f16* x, T* out, unsigned long long n) {              \
        cast<f16, T>(x, out, n);                                                                       \
    }                                                                                                  \
    extern "C" __global__ void euler_step_cast_##S(float* x, const float* v, T* x_cast,                \
                                                   unsigned long long n, float dt) {                   \
        euler_step_cast<T>(x, v, x_cast, n, dt);                                                       \
    }                                                                                                  \
    extern "C" __global__ void euler_step_inpaint_cast_##S(                                            \
        float* x, const float* v, T* x_cast, unsigned long long n, float dt, const float* x1,          \
        const float* frozen, const int* frozen_rows, unsigned row_len, float t_next) {                 \
        euler_step_inpaint_cast<T>(x, v, x_cast, n, dt, x1, frozen, frozen_rows, row_len, t_next);     \
    }                                                                                                  \
    extern "C" __global__ void velocity_euler_##S(                                                     \
        const float* h, unsigned long long sh, const float* w, const float* b, float* v, float* x,     \
        unsigned n, unsigned k, float dt, T* x_cast, const float* x1, const float* frozen,             \
        const int* frozen_rows, float t_next, int vec4) {                                              \
        velocity_euler<T>(h, sh, w, b, v, x, n, k, dt, x_cast, x1, frozen, frozen_rows, t_next, vec4);  \
    }
FOR_FLOATS(ELEMENTWISE)
