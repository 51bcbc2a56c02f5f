// The first half of a gated MLP for few rows, on tensor cores (bf16 or f16 in, f32
// accumulation): h = gelu_tanh(x·Wgᵀ) ⊙ (x·Wuᵀ) with w = [Wg ; Wu] ([2F, K], gate rows first),
// x [M, K] with M ≤ 64. Host side and when it is chosen: kernels/src/ops/mlp.rs (GegluLinear).
//
// With so few rows the product is a stream of the weight from memory: a block takes MLP_BF
// output features, i.e. MLP_BF gate rows and the MLP_BF up rows of the same features (one
// 64-row tile of w), and all of x, and walks K in chunks of MLP_BK through a ring of
// MLP_STAGES shared-memory stages filled by cp.async (MLP_STAGES - 1 chunks in flight while
// one is used). Warp w computes rows 16w..16w+15 of x against the whole tile; its accumulators
// hold a feature's gate and up values in the same lanes (tiles n and n + 4), so the GELU and the
// product happen in registers and only h is written. Fragment layouts as in flash.cu.

#define MLP_BM 64
#define MLP_BF 32
#define MLP_BK 128
#define MLP_STAGES 5
#define MLP_THREADS 128
#define MLP_LD (MLP_BK + 8)  // shared row stride (elements): conflict-free ldmatrix

template <typename T>
__device__ void geglu_linear(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ h, unsigned m,
                             unsigned k, unsigned f, unsigned long long sx, unsigned long long sw,
                             unsigned long long sh) {
    extern __shared__ __align__(16) unsigned char mlp_smem[];
    unsigned short* xs = (unsigned short*)mlp_smem;     // [MLP_STAGES][MLP_BM][MLP_LD]
    unsigned short* ws = xs + MLP_STAGES * MLP_BM * MLP_LD;  // [MLP_STAGES][2·MLP_BF][MLP_LD]
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned f0 = blockIdx.x * MLP_BF;
    const unsigned chunks = (k + MLP_BK - 1) / MLP_BK;

    // Chunk c into stage c % MLP_STAGES: x rows past m and columns past k are zeros (nothing is
    // read for them); tile row r < MLP_BF is gate feature f0 + r, row r ≥ MLP_BF up feature
    // f0 + r - MLP_BF (w row f + f0 + r - MLP_BF). 64 rows of 8 16-byte pieces each.
    auto stage = [&](unsigned c) {
        unsigned short* xd = xs + (c % MLP_STAGES) * MLP_BM * MLP_LD;
        unsigned short* wd = ws + (c % MLP_STAGES) * 2 * MLP_BF * MLP_LD;
#pragma unroll
        for (int it = 0; it < MLP_BM * (MLP_BK / 8) / MLP_THREADS; ++it) {
            const unsigned idx = it * MLP_THREADS + threadIdx.x, r = idx / (MLP_BK / 8), p = idx % (MLP_BK / 8);
            const unsigned kk = c * MLP_BK + p * 8;
            const bool okx = r < m && kk < k, okw = kk < k;
            cp_async16(xd + r * MLP_LD + p * 8, okx ? x + r * sx + kk : x, okx);
            const unsigned long long wr = r < MLP_BF ? f0 + r : f + f0 + (r - MLP_BF);
            cp_async16(wd + r * MLP_LD + p * 8, okw ? w + wr * sw + kk : w, okw);
        }
    };
#pragma unroll
    for (unsigned c = 0; c < MLP_STAGES - 1; ++c) {
        if (c < chunks) stage(c);
        cp_async_commit();
    }

    float acc[2 * MLP_BF / 8][4];
#pragma unroll
    for (int n = 0; n < 2 * MLP_BF / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    // Per-lane ldmatrix offsets (elements): A rows of x, B rows of the weight tile.
    const unsigned xa = (warp * 16 + (lane & 15)) * MLP_LD + (lane >> 4) * 8;
    const unsigned wb = ((lane & 7) + ((lane >> 4) << 3)) * MLP_LD + ((lane >> 3) & 1) * 8;

    for (unsigned c = 0; c < chunks; ++c) {
        cp_async_wait<MLP_STAGES - 2>();  // chunk c has landed (for this thread's pieces)
        __syncthreads();                  // for every thread's; and chunk c - 1 is used up
        if (c + MLP_STAGES - 1 < chunks) stage(c + MLP_STAGES - 1);
        cp_async_commit();
        const unsigned xb = smem_addr(xs + (c % MLP_STAGES) * MLP_BM * MLP_LD + xa);
        const unsigned wt = smem_addr(ws + (c % MLP_STAGES) * 2 * MLP_BF * MLP_LD + wb);
#pragma unroll
        for (int kk = 0; kk < MLP_BK / 16; ++kk) {
            unsigned a[4];
            ldmatrix_x4(a, xb + kk * 32);
#pragma unroll
            for (int nb = 0; nb < 2 * MLP_BF / 16; ++nb) {
                unsigned b[4];
                ldmatrix_x4(b, wt + (nb * 16 * MLP_LD + kk * 16) * 2);
                Mma<T>::run(acc[2 * nb], a, b[0], b[1]);
                Mma<T>::run(acc[2 * nb + 1], a, b[2], b[3]);
            }
        }
    }

    // Lane (g, t) holds rows g and g + 8 of the warp's 16, columns 2t and 2t + 1 of each 8-wide
    // tile: tile n < MLP_BF / 8 is gate features f0 + 8n + 2t (+1), tile n + MLP_BF / 8 the same
    // features' up values.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const unsigned row = warp * 16 + g + 8 * rr;
        if (row >= m) continue;
        T* hrow = h + row * sh + f0;
#pragma unroll
        for (int n = 0; n < MLP_BF / 8; ++n) {
            const float* gate = acc[n] + 2 * rr;
            const float* up = acc[n + MLP_BF / 8] + 2 * rr;
            *(unsigned*)(hrow + n * 8 + 2 * t) =
                Mma<T>::pack(gelu_tanh(gate[0]) * up[0], gelu_tanh(gate[1]) * up[1]);
        }
    }
}

#define GEGLU_LINEAR(T, S)                                                                               \
    extern "C" __global__ void __launch_bounds__(MLP_THREADS)                                           \
        geglu_linear_##S(const T* x, const T* w, T* h, unsigned m, unsigned k, unsigned f,               \
                         unsigned long long sx, unsigned long long sw, unsigned long long sh) {          \
        geglu_linear<T>(x, w, h, m, k, f, sx, sw, sh);                                                   \
    }
GEGLU_LINEAR(bf16, bf16)
GEGLU_LINEAR(f16, f16)
