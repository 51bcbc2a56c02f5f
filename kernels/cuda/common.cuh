// Shared by every kernels/cuda/*.cu (prepended by the registry before NVRTC compiles it).
// Storage types and f32 conversions of our own, so no toolkit header is needed at run time.
// Host twins: half::bf16 / half::f16 (round to nearest even; NaN stays NaN).

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (sm_90 and later; nothing elsewhere). pdl_trigger lets the
// next kernel in the stream start now when it was launched dependent (launch_raw);
// otherwise it does nothing. pdl_wait, in a kernel launched dependent, waits until the kernel
// before it has finished and its writes are visible; otherwise it returns at once.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float to_f32(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(unsigned short)(u >> 16)};
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return f16{h};
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < warps ? part[lane] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < warps ? part[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// Instantiates `M(T, suffix)` for the three float storage types.
#define FOR_FLOATS(M) M(float, f32) M(bf16, bf16) M(f16, f16)

// Eight consecutive elements as f32, through 16-byte accesses. `p` must be 16-byte aligned
// (the host side checks alignment and sizes before choosing a vectorized launch).
__device__ __forceinline__ void load8(const float* p, float v[8]) {
    const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float v[8]) {
    const uint4 u = *(const uint4*)p;
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ void load8(const f16* p, float v[8]) {
    const uint4 u = *(const uint4*)p;
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = to_f32(f16{(unsigned short)(w[k] & 0xffffu)});
        v[2 * k + 1] = to_f32(f16{(unsigned short)(w[k] >> 16)});
    }
}
__device__ __forceinline__ void store8(float* p, const float v[8]) {
    *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4*)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
// Eight consecutive f32 through 16-byte loads where p is 16-byte aligned, else one at a time.
__device__ __forceinline__ void load8_f32(const float* p, float v[8]) {
    if (!((size_t)p & 15)) {
        load8(p, v);
        return;
    }
    for (int k = 0; k < 8; ++k) v[k] = p[k];
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const float v[8]) {
    unsigned w[4];
    for (int k = 0; k < 4; ++k)
        w[k] = (unsigned)from_f32<T>(v[2 * k]).x | ((unsigned)from_f32<T>(v[2 * k + 1]).x << 16);
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// Tensor cores (sm_80 and later; used by flash.cu and mlp.cu): mma.sync m16n8k16 with f32
// accumulation, ldmatrix, and cp.async staging into shared memory.
//
// mma.sync and the f32-pair packing for one 16-bit type (`ty`: its PTX name).
template <typename T> struct Mma;
#if __CUDA_ARCH__ >= 800
#define TC_MMA(T, ty)                                                                                  \
    template <> struct Mma<T> {                                                                       \
        static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1) { \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ty "." ty ".f32 {%0,%1,%2,%3}, "    \
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                     \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                             \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));             \
        }                                                                                             \
        /* Two f32 as one register: `lo` in the low half (the lower column). */                       \
        static __device__ __forceinline__ unsigned pack(float lo, float hi) {                         \
            unsigned r;                                                                               \
            asm("cvt.rn." ty "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));                      \
            return r;                                                                                 \
        }                                                                                             \
    };
// A shared-memory address as the 32-bit offset PTX's shared state space takes.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
// 16 bytes global → shared without passing through registers; `ok == false` writes zeros
// (nothing is read from `src`).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait1() { cp_async_wait<1>(); }
// Four 8×8 matrices of 16-bit elements from shared address `p` (see smem_addr); `_t`:
// transposed.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], unsigned p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], unsigned p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(p));
}
#else
// Before sm_80 there is no such mma, cp.async or ldmatrix: the kernels compile empty and are
// never chosen.
#define TC_MMA(T, ty)                                                                                  \
    template <> struct Mma<T> {                                                                       \
        static __device__ __forceinline__ void run(float*, const unsigned*, unsigned, unsigned) {}    \
        static __device__ __forceinline__ unsigned pack(float, float) { return 0; }                   \
    };
__device__ __forceinline__ void cp_async16(void*, const void*, bool) {}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
__device__ __forceinline__ void cp_async_wait1() {}
__device__ __forceinline__ unsigned smem_addr(const void*) { return 0; }
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], unsigned) { r[0] = r[1] = r[2] = r[3] = 0; }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], unsigned) { r[0] = r[1] = r[2] = r[3] = 0; }
#endif
TC_MMA(bf16, "bf16")
TC_MMA(f16, "f16")

// FP8 E4M3 codes, with the host's arithmetic (kernels/src/fp8.rs): round to nearest, ties to an
// even mantissa; beyond ±448 (infinities included) the largest finite value; every NaN 0x7f.
// Written out in integer steps for devices without the conversion instruction (before sm_89);
// e4m3_from_f32 and e4m3x2_from_f32 below give the same codes.
__device__ __forceinline__ unsigned char e4m3_from_f32_steps(float x) {
    const unsigned bits = __float_as_uint(x);
    const unsigned char sign = (unsigned char)((bits >> 24) & 0x80u);
    if (x != x) return 0x7f;
    const float a = fabsf(x);
    if (a >= 448.f) return sign | 0x7e;
    // Subnormal steps of 2^-9 (the scaling is exact; rintf rounds ties to even).
    if (a < 0.015625f) return sign | (unsigned char)rintf(a * 512.f);
    const unsigned ab = __float_as_uint(a);
    int e = (int)((ab >> 23) & 0xffu) - 127;
    const unsigned m = ab & 0x7fffffu, rest = m & 0xfffffu;
    unsigned q = m >> 20;
    if (rest > 0x80000u || (rest == 0x80000u && (q & 1u))) ++q;
    if (q == 8u) {
        q = 0u;
        ++e;
    }
    const int biased = e + 7;
    if (biased > 15 || (biased == 15 && q == 7u)) return sign | 0x7e;
    return sign | (unsigned char)((biased << 3) | (int)q);
}
// Two codes at once: e4m3_from_f32(a) in the low byte, e4m3_from_f32(b) in the high byte. On
// sm_89 and later one conversion instruction with the host's arithmetic (round to nearest even;
// finite values past ±448 and infinities saturate to ±448; NaN gives 0x7f).
__device__ __forceinline__ unsigned e4m3x2_from_f32(float a, float b) {
#if __CUDA_ARCH__ >= 890
    unsigned short d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
    return d;
#else
    return e4m3_from_f32_steps(a) | ((unsigned)e4m3_from_f32_steps(b) << 8);
#endif
}
// One code, as e4m3x2_from_f32 converts it.
__device__ __forceinline__ unsigned char e4m3_from_f32(float x) {
#if __CUDA_ARCH__ >= 890
    return (unsigned char)e4m3x2_from_f32(x, 0.f);
#else
    return e4m3_from_f32_steps(x);
#endif
}
// The codes of v[k] / cs for k < n (n: 1, 2, 4 or 8) at p, each division correctly rounded as
// on the host; one store of n bytes where p is aligned to n, else a byte at a time.
__device__ __forceinline__ void store_codes(unsigned char* p, const float* v, int n, float cs) {
    if (n == 8 && !((size_t)p & 7)) {
        unsigned w[4];
        for (int k = 0; k < 4; ++k) w[k] = e4m3x2_from_f32(v[2 * k] / cs, v[2 * k + 1] / cs);
        *(uint2*)p = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
        return;
    }
    if (n == 4 && !((size_t)p & 3)) {
        *(unsigned*)p = e4m3x2_from_f32(v[0] / cs, v[1] / cs) | (e4m3x2_from_f32(v[2] / cs, v[3] / cs) << 16);
        return;
    }
    for (int k = 0; k < n; ++k) p[k] = e4m3_from_f32(v[k] / cs);
}
__device__ __forceinline__ float e4m3_to_f32(unsigned char c) {
    const int e = (c >> 3) & 0xf, m = c & 7;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    const float mag = e == 0 ? (float)m * 0.001953125f : ldexpf(1.f + (float)m * 0.125f, e - 7);
    return (c & 0x80) ? -mag : mag;
}

// ---- Hopper (sm_90a): the tensor memory accelerator and asynchronous warpgroup MMAs ------------

// A CUtensorMap, opaque: 128 bytes the driver encoded (cuTensorMapEncodeTiled).
struct __align__(64) TmaMap {
    unsigned long long bits[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A shared-memory matrix descriptor, K-major with the 128-byte swizzle: 8-row atoms 1024 bytes
// apart.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

// A 2-d box of `map` at (c0, c1) into shared `dst`, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// Thread 0 of a block: the `stages` barriers of a TMA ring, 8 bytes apart from `bars`, one
// arrival each, made visible to the copies that will complete them.
__device__ __forceinline__ void mbar_init_ring(unsigned bars, unsigned stages) {
    for (unsigned s = 0; s < stages; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
}
#endif

// acc[i] of lane l in warp v: A's row (the feature) 16v + l/4 + 8·((i/2) % 2), B's row (the
// token) 8·(i/4) + 2·(l % 4) + i % 2.
__device__ __forceinline__ unsigned wg_feature(unsigned warp, unsigned lane, int i) {
    return warp * 16 + (lane >> 2) + 8 * ((i >> 1) & 1);
}
__device__ __forceinline__ unsigned wg_token(unsigned lane, int i) { return (i >> 2) * 8 + 2 * (lane & 3) + (i & 1); }
