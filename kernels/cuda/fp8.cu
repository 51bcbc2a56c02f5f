// FP8 E4M3 quantization with a static scale kept in device memory (a new calibration rewrites
// it; a captured graph reads the new value). Host twin: kernels/src/ops/fp8.rs.

// out[i] = e4m3(x[i] / scale[0]), the division correctly rounded as on the host.
template <typename T>
__device__ void quantize_e4m3(const T* __restrict__ x, const float* __restrict__ scale, unsigned char* __restrict__ out,
                              unsigned long long n) {
    const float s = *scale;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = e4m3_from_f32(to_f32(x[i]) / s);
}

// out[i] = code[i] · scale[0], rounded to T (a check of what a quantized tensor holds).
template <typename T>
__device__ void dequantize_e4m3(const unsigned char* __restrict__ code, const float* __restrict__ scale, T* __restrict__ out,
                                unsigned long long n) {
    const float s = *scale;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(e4m3_to_f32(code[i]) * s);
}

#define FP8(T, S)                                                                                       \
    extern "C" __global__ void quantize_e4m3_##S(const T* x, const float* scale, unsigned char* out,     \
                                                 unsigned long long n) {                                \
        quantize_e4m3<T>(x, scale, out, n);                                                             \
    }                                                                                                   \
    extern "C" __global__ void dequantize_e4m3_##S(const unsigned char* code, const float* scale, T* out, \
                                                   unsigned long long n) {                              \
        dequantize_e4m3<T>(code, scale, out, n);                                                        \
    }
FOR_FLOATS(FP8)
