// Elementwise ops. Host twin: kernels/src/ops/elementwise.rs.

// Unary ops, contiguous, n elements: 0 silu, 1 gelu (tanh), 2 gelu (erf), 3 scale by alpha.
template <typename T>
__device__ void unary(const T* x, T* out, unsigned long long n, int op, float alpha) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = to_f32(x[i]), r;
        switch (op) {
            case 0: r = v / (1.f + expf(-v)); break;
            case 1: r = gelu_tanh(v); break;
            case 2: r = 0.5f * v * (1.f + erff(v * 0.7071067811865476f)); break;
            default: r = alpha * v; break;
        }
        out[i] = from_f32<T>(r);
    }
}

// Binary ops over rows × cols with row strides (b's row stride 0 = one row broadcast):
// 0: a + alpha * b, 1: a * b, 2: gelu_tanh(a) * b.
template <typename T>
__device__ void binary(const T* a, const T* b, T* out, unsigned rows, unsigned cols, unsigned long long sa,
                       unsigned long long sb, unsigned long long so, int op, float alpha) {
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long r = i / cols, c = i % cols;
        float x = to_f32(a[r * sa + c]), y = to_f32(b[r * sb + c]), v;
        switch (op) {
            case 0: v = x + alpha * y; break;
            case 1: v = x * y; break;
            default: v = gelu_tanh(x) * y; break;
        }
        out[r * so + c] = from_f32<T>(v);
    }
}

// out = x + y * gate (gate row stride 0 = one row broadcast).
template <typename T>
__device__ void gated_residual(const T* x, const T* y, const T* gate, T* out, unsigned rows, unsigned cols,
                               unsigned long long sx, unsigned long long sy, unsigned long long sg,
                               unsigned long long so) {
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
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

#define ELEMENTWISE(T, S)                                                                              \
    extern "C" __global__ void unary_##S(const T* x, T* out, unsigned long long n, int op, float alpha) { \
        unary<T>(x, out, n, op, alpha);                                                                \
    }                                                                                                  \
    extern "C" __global__ void binary_##S(const T* a, const T* b, T* out, unsigned rows, unsigned cols,  \
                                          unsigned long long sa, unsigned long long sb,                \
                                          unsigned long long so, int op, float alpha) {                \
        binary<T>(a, b, out, rows, cols, sa, sb, so, op, alpha);                                       \
    }                                                                                                  \
    extern "C" __global__ void gated_residual_##S(const T* x, const T* y, const T* g, T* out,           \
                                                  unsigned rows, unsigned cols, unsigned long long sx, \
                                                  unsigned long long sy, unsigned long long sg,        \
                                                  unsigned long long so) {                             \
        gated_residual<T>(x, y, g, out, rows, cols, sx, sy, sg, so);                                   \
    }                                                                                                  \
    extern "C" __global__ void cast_f32_##S(const float* x, T* out, unsigned long long n) {            \
        cast<float, T>(x, out, n);                                                                     \
    }                                                                                                  \
    extern "C" __global__ void cast_bf16_##S(const bf16* x, T* out, unsigned long long n) {            \
        cast<bf16, T>(x, out, n);                                                                      \
    }                                                                                                  \
    extern "C" __global__ void cast_f16_##S(const f16* x, T* out, unsigned long long n) {              \
        cast<f16, T>(x, out, n);                                                                       \
    }
FOR_FLOATS(ELEMENTWISE)
