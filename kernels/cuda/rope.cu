// Positional ops: RoPE (split halves), embedding gather with a scale, sin-cos embedding.
// Host twin: kernels/src/ops/rope.rs.

// x: rows = tokens * heads, each of `dim` (row stride sx); positions: int32 per token.
// Pair i of a row rotates (x[i], x[i + dim/2]) by pos / max_wavelength^(2i/dim).
template <typename T>
__device__ void rope(const T* x, const int* positions, T* out, unsigned rows, unsigned heads, unsigned dim,
                     unsigned long long sx, unsigned long long so, float max_wavelength) {
    const unsigned half = dim / 2;
    const unsigned long long n = (unsigned long long)rows * half;
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
         k += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long row = k / half;
        const unsigned i = k % half;
        const float pos = (float)positions[row / heads];
        const float timescale = powf(max_wavelength, (2.f / dim) * i);
        float sn, cs;
        sincosf(pos / timescale, &sn, &cs);
        const float x1 = to_f32(x[row * sx + i]), x2 = to_f32(x[row * sx + half + i]);
        out[row * so + i] = from_f32<T>(x1 * cs - x2 * sn);
        out[row * so + half + i] = from_f32<T>(x2 * cs + x1 * sn);
    }
}

// The sine and cosine rope_qkv rotates pair i of a head of `dim` at `position` by.
__device__ __forceinline__ void rope_angle(int position, unsigned i, unsigned dim, float max_wavelength, float* sn,
                                           float* cs) {
    const float timescale = powf(max_wavelength, (2.f / dim) * i);
    sincosf((float)position / timescale, sn, cs);
}

// Head h of one (token, pair) of rope_qkv, (x1, x2) its pair: a q or k head rotated by (cs, sn),
// a v head copied.
template <typename T>
__device__ __forceinline__ void rope_qkv_put(T* __restrict__ q, T* __restrict__ k, T* __restrict__ v, unsigned t,
                                             unsigned i, unsigned h, unsigned hq, unsigned hk, unsigned dim,
                                             unsigned long long sq, unsigned long long sk, unsigned long long sv,
                                             float cs, float sn, T x1, T x2) {
    const unsigned half = dim / 2;
    if (h >= hq + hk) {
        T* o = v + t * sv + (unsigned long long)(h - hq - hk) * dim + i;
        o[0] = x1;
        o[half] = x2;
        return;
    }
    T* o = h < hq ? q + t * sq + (unsigned long long)h * dim + i : k + t * sk + (unsigned long long)(h - hq) * dim + i;
    const float f1 = to_f32(x1), f2 = to_f32(x2);
    o[0] = from_f32<T>(f1 * cs - f2 * sn);
    o[half] = from_f32<T>(f2 * cs + f1 * sn);
}

// The heads of one (token, pair) of rope_qkv, rotated by (cs, sn); x(o): the input at offset o
// from the pair's first element in its token's row (as T). The heads blockIdx.y, blockIdx.y +
// gridDim.y, ...; with GROUPED (a thread taking every head: grid.y of 1), RQ_GROUP heads' pairs
// are loaded before any of them is stored, so that their loads are in flight together (a head's
// loads would otherwise wait behind the stores before them).
#define RQ_GROUP 5
template <typename T, bool GROUPED = false, typename X>
__device__ __forceinline__ void rope_qkv_pair(X x, T* __restrict__ q, T* __restrict__ k, T* __restrict__ v, unsigned t,
                                              unsigned i, unsigned hq, unsigned hk, unsigned dim,
                                              unsigned long long sq, unsigned long long sk, unsigned long long sv,
                                              float cs, float sn) {
    const unsigned half = dim / 2, heads = hq + 2 * hk;
    if (GROUPED && gridDim.y == 1) {
        for (unsigned h0 = 0; h0 < heads; h0 += RQ_GROUP) {
            T x1[RQ_GROUP], x2[RQ_GROUP];
#pragma unroll
            for (unsigned j = 0; j < RQ_GROUP; ++j)
                if (h0 + j < heads) {
                    x1[j] = x((h0 + j) * dim);
                    x2[j] = x((h0 + j) * dim + half);
                }
#pragma unroll
            for (unsigned j = 0; j < RQ_GROUP; ++j)
                if (h0 + j < heads) rope_qkv_put<T>(q, k, v, t, i, h0 + j, hq, hk, dim, sq, sk, sv, cs, sn, x1[j], x2[j]);
        }
        return;
    }
#pragma unroll 2
    for (unsigned h = blockIdx.y; h < heads; h += gridDim.y)
        rope_qkv_put<T>(q, k, v, t, i, h, hq, hk, dim, sq, sk, sv, cs, sn, x(h * dim), x(h * dim + half));
}

// A fused projection's output split into heads: qkv rows are [q heads | k heads | v heads]
// (each `dim` wide, row stride s_in). q and k heads are rotated as `rope` does and written to
// q and k; v heads are copied to v (each of those with its own row stride). A thread takes one
// (token, pair) and the heads blockIdx.y, blockIdx.y + gridDim.y, ...: the angle is computed
// once for all of them (the host spreads the heads over grid.y only where tokens are few).
// With scale (f32, one per feature of a qkv row; may be null) each input value is first
// multiplied by its feature's scale in f32 and rounded to T: the projection of an FP8 GEMM
// that left its weight's per-feature scales to its reader.
template <typename T>
__device__ void rope_qkv(const T* __restrict__ qkv, const int* __restrict__ positions, T* __restrict__ q,
                         T* __restrict__ k, T* __restrict__ v, unsigned tokens, unsigned hq, unsigned hk,
                         unsigned dim, unsigned long long s_in, unsigned long long sq, unsigned long long sk,
                         unsigned long long sv, float max_wavelength, const float* __restrict__ scale) {
    const unsigned half = dim / 2;
    const unsigned n = tokens * half;  // the host checks that it fits 32 bits
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        const unsigned t = idx / half, i = idx % half;
        float sn, cs;
        rope_angle(positions[t], i, dim, max_wavelength, &sn, &cs);
        const T* row = qkv + t * s_in + i;
        if (scale) {
            const float* sc = scale + i;
            auto x = [=](unsigned o) { return from_f32<T>(to_f32(row[o]) * sc[o]); };
            rope_qkv_pair<T, true>(x, q, k, v, t, i, hq, hk, dim, sq, sk, sv, cs, sn);
        } else {
            rope_qkv_pair<T, true>([=](unsigned o) { return row[o]; }, q, k, v, t, i, hq, hk, dim, sq, sk, sv, cs,
                                   sn);
        }
    }
}

// rope_qkv with the angles read from a table made by rope_table_f32 (the same values, so the
// same bits): table[t · dim/2 + i] = (cos, sin).
template <typename T>
__device__ void rope_qkv_table(const T* __restrict__ qkv, const float2* __restrict__ table, T* __restrict__ q,
                               T* __restrict__ k, T* __restrict__ v, unsigned tokens, unsigned hq, unsigned hk,
                               unsigned dim, unsigned long long s_in, unsigned long long sq, unsigned long long sk,
                               unsigned long long sv) {
    const unsigned half = dim / 2;
    const unsigned n = tokens * half;  // the host checks that it fits 32 bits
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        const unsigned t = idx / half, i = idx % half;
        const float2 c = table[idx];
        const T* row = qkv + t * s_in + i;
        rope_qkv_pair<T>([=](unsigned o) { return row[o]; }, q, k, v, t, i, hq, hk, dim, sq, sk, sv, c.x, c.y);
    }
}

// rope_qkv_table with qkv given as the f32 partial sums of a split GEMM: parts[p, t, :] (each
// part `part` floats after the one before, rows s_in apart), added in part order and rounded to
// T, the value a whole GEMM's output of type T holds; then as rope_qkv_table.
template <typename T>
__device__ void rope_qkv_table_parts(const float* __restrict__ parts, unsigned nparts, unsigned long long part,
                                     const float2* __restrict__ table, T* __restrict__ q, T* __restrict__ k,
                                     T* __restrict__ v, unsigned tokens, unsigned hq, unsigned hk, unsigned dim,
                                     unsigned long long s_in, unsigned long long sq, unsigned long long sk,
                                     unsigned long long sv) {
    const unsigned half = dim / 2;
    const unsigned n = tokens * half;  // the host checks that it fits 32 bits
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        const unsigned t = idx / half, i = idx % half;
        const float2 c = table[idx];
        const float* row = parts + t * s_in + i;
        auto sum = [=](unsigned o) {
            float s = row[o];
            for (unsigned p = 1; p < nparts; ++p) s += row[p * part + o];
            return from_f32<T>(s);
        };
        rope_qkv_pair<T>(sum, q, k, v, t, i, hq, hk, dim, sq, sk, sv, c.x, c.y);
    }
}

// The angles rope_qkv rotates by, for rope_qkv_table: table[t · dim/2 + i] = (cos, sin) of
// positions[t] / max_wavelength^(2i/dim), computed as rope_qkv computes them.
extern "C" __global__ void rope_table_f32(const int* __restrict__ positions, float2* __restrict__ table, unsigned tokens,
                                          unsigned dim, float max_wavelength) {
    const unsigned half = dim / 2, n = tokens * half;  // the host checks that it fits 32 bits
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        float sn, cs;
        rope_angle(positions[idx / half], idx % half, dim, max_wavelength, &sn, &cs);
        table[idx] = make_float2(cs, sn);
    }
}

// out[r, :] = table[ids[r], :] * scale; an id outside [0, vocab) gives a zero row.
template <typename T>
__device__ void embedding(const int* ids, const T* table, T* out, unsigned rows, unsigned width, unsigned vocab,
                          float scale) {
    const unsigned long long n = (unsigned long long)rows * width;
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
         k += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = k / width, c = k % width;
        const int id = ids[r];
        const float v = (id >= 0 && (unsigned)id < vocab) ? to_f32(table[(unsigned long long)id * width + c]) * scale : 0.f;
        out[k] = from_f32<T>(v);
    }
}

// out[r, j] = sin(2 pi t_r / p_j), out[r, h + j] = cos(...), p_j = min_p (max_p / min_p)^(j / (h - 1)).
template <typename T>
__device__ void sinusoidal(const T* t, T* out, unsigned rows, unsigned half, float min_period, float max_period) {
    const unsigned long long n = (unsigned long long)rows * half;
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
         k += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = k / half;
        const unsigned j = k % half;
        const float fraction = half > 1 ? (float)j / (float)(half - 1) : 0.f;
        const float period = min_period * powf(max_period / min_period, fraction);
        const float arg = to_f32(t[r]) * (6.283185307179586f / period);
        out[r * 2 * half + j] = from_f32<T>(sinf(arg));
        out[r * 2 * half + half + j] = from_f32<T>(cosf(arg));
    }
}

#define POSITIONAL(T, S)                                                                                \
    extern "C" __global__ void rope_##S(const T* x, const int* p, T* out, unsigned rows, unsigned heads,  \
                                        unsigned dim, unsigned long long sx, unsigned long long so,      \
                                        float max_wavelength) {                                          \
        rope<T>(x, p, out, rows, heads, dim, sx, so, max_wavelength);                                    \
    }                                                                                                   \
    extern "C" __global__ void rope_qkv_##S(const T* qkv, const int* p, T* q, T* k, T* v, unsigned tokens,  \
                                            unsigned hq, unsigned hk, unsigned dim,                      \
                                            unsigned long long s_in, unsigned long long sq,              \
                                            unsigned long long sk, unsigned long long sv, float mw,      \
                                            const float* scale) {                                        \
        rope_qkv<T>(qkv, p, q, k, v, tokens, hq, hk, dim, s_in, sq, sk, sv, mw, scale);                  \
    }                                                                                                   \
    extern "C" __global__ void rope_qkv_table_##S(const T* qkv, const float2* table, T* q, T* k, T* v,   \
                                                  unsigned tokens, unsigned hq, unsigned hk, unsigned dim, \
                                                  unsigned long long s_in, unsigned long long sq,          \
                                                  unsigned long long sk, unsigned long long sv) {          \
        rope_qkv_table<T>(qkv, table, q, k, v, tokens, hq, hk, dim, s_in, sq, sk, sv);                    \
    }                                                                                                   \
    extern "C" __global__ void rope_qkv_table_parts_##S(                                                \
        const float* parts, unsigned nparts, unsigned long long part, const float2* table, T* q, T* k,  \
        T* v, unsigned tokens, unsigned hq, unsigned hk, unsigned dim, unsigned long long s_in,         \
        unsigned long long sq, unsigned long long sk, unsigned long long sv) {                          \
        rope_qkv_table_parts<T>(parts, nparts, part, table, q, k, v, tokens, hq, hk, dim, s_in, sq, sk, sv); \
    }                                                                                                   \
    extern "C" __global__ void embedding_##S(const int* ids, const T* table, T* out, unsigned rows,       \
                                             unsigned width, unsigned vocab, float scale) {              \
        embedding<T>(ids, table, out, rows, width, vocab, scale);                                        \
    }                                                                                                   \
    extern "C" __global__ void sinusoidal_##S(const T* t, T* out, unsigned rows, unsigned half,           \
                                              float min_period, float max_period) {                      \
        sinusoidal<T>(t, out, rows, half, min_period, max_period);                                       \
    }
FOR_FLOATS(POSITIONAL)
