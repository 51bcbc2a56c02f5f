// Attention: one block per (query, head); scores in shared memory, softmax in f32.
// Host twin: kernels/src/ops/attention.rs.
//
// q [Sq, Hq, D] (row stride sq per query), k and v [Sk, Hkv, D] (row strides sk, sv),
// out [Sq, Hq, D] (row stride so). Query head h reads key/value head h / (Hq / Hkv).
// Key j is visible to query i when (j < valid || j >= always_from), key_mask[j] != 0 (when
// given), and, if causal, j <= i + causal_offset. `valid` is *valid_len (device memory) or Sk when null.
// A query that sees no key gets zeros.
template <typename T>
__device__ void attention(const T* q, const T* k, const T* v, T* out, const int* valid_len, const unsigned char* key_mask, unsigned sq_len,
                          unsigned sk_len, unsigned hq, unsigned hkv, unsigned d, unsigned long long sq,
                          unsigned long long sk, unsigned long long sv, unsigned long long so,
                          unsigned always_from, int causal, unsigned causal_offset, float scale) {
    extern __shared__ float smem[];
    float* qs = smem;          // d
    float* scores = smem + d;  // sk_len
    const unsigned i = blockIdx.x, h = blockIdx.y, kh = h / (hq / hkv);
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int vl = valid_len ? *valid_len : (int)sk_len;
    const T* qi = q + i * sq + (unsigned long long)h * d;
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) qs[c] = to_f32(qi[c]) * scale;
    __syncthreads();
    for (unsigned j = warp; j < sk_len; j += warps) {
        bool visible = ((int)j < vl || j >= always_from) && (!causal || j <= i + causal_offset) && (!key_mask || key_mask[j]);
        float s = 0.f;
        if (visible) {
            const T* kj = k + j * sk + (unsigned long long)kh * d;
            for (unsigned c = lane; c < d; c += 32) s += qs[c] * to_f32(kj[c]);
            s = warp_sum(s);
        }
        if (lane == 0) scores[j] = visible ? s : -INFINITY;
    }
    __syncthreads();
    float m = -INFINITY;
    for (unsigned j = threadIdx.x; j < sk_len; j += blockDim.x) m = fmaxf(m, scores[j]);
    m = block_max(m);
    float sum = 0.f;
    for (unsigned j = threadIdx.x; j < sk_len; j += blockDim.x) {
        float p = m == -INFINITY ? 0.f : expf(scores[j] - m);
        scores[j] = p;
        sum += p;
    }
    sum = block_sum(sum);
    __syncthreads();
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* oi = out + i * so + (unsigned long long)h * d;
    // Four independent accumulators: the loads of consecutive keys overlap.
    const T* vh = v + (unsigned long long)kh * d;
    for (unsigned c = threadIdx.x; c < d; c += blockDim.x) {
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        unsigned j = 0;
        for (; j + 4 <= sk_len; j += 4) {
            a0 += scores[j] * to_f32(vh[j * sv + c]);
            a1 += scores[j + 1] * to_f32(vh[(j + 1) * sv + c]);
            a2 += scores[j + 2] * to_f32(vh[(j + 2) * sv + c]);
            a3 += scores[j + 3] * to_f32(vh[(j + 3) * sv + c]);
        }
        for (; j < sk_len; ++j) a0 += scores[j] * to_f32(vh[j * sv + c]);
        oi[c] = from_f32<T>((a0 + a1 + a2 + a3) * inv);
    }
}

#define ATTENTION(T, S)                                                                                   \
    extern "C" __global__ void attention_##S(                                                             \
        const T* q, const T* k, const T* v, T* out, const int* valid_len, const unsigned char* key_mask, unsigned sq_len, unsigned sk_len,  \
        unsigned hq, unsigned hkv, unsigned d, unsigned long long sq, unsigned long long sk,               \
        unsigned long long sv, unsigned long long so, unsigned always_from, int causal,                    \
        unsigned causal_offset, float scale) {                                                             \
        attention<T>(q, k, v, out, valid_len, key_mask, sq_len, sk_len, hq, hkv, d, sq, sk, sv, so, always_from, causal, \
                     causal_offset, scale);                                                                \
    }
FOR_FLOATS(ATTENTION)

// Softmax of attention scores with the same masks, for the GEMM path (scores = Q·Kᵀ by
// cuBLASLt). scores: f32 [hq, sq_len, sk_len] (row r = h * sq_len + i); probs: T, same shape.
// A row with no visible key becomes zeros.
// One warp per row (blockDim.x / 32 rows a block); rows up to 32 * SOFTMAX_REGS keys are held in
// registers, longer ones are read three times. With vec8 (sk_len a multiple of 8 and at most
// 32 * SOFTMAX_REGS, scores and probs 16-byte aligned) each lane moves 8 consecutive keys per
// access: a lane's share of the row is then chunks of 8 keys, 256 keys apart.
// masked_softmax_vec3: the vec8 form alone for rows of at most 768 keys (3 chunks a lane: e.g.
// Gemma's prefix, 576), with only the registers that needs; the same arithmetic, so the same
// bits (the chunks it leaves out would only add zeros).
#define SOFTMAX_REGS 32
template <typename T, int C = SOFTMAX_REGS / 8, bool ANY = true>
__device__ void masked_softmax(const float* scores, T* probs, unsigned rows, unsigned sq_len, unsigned sk_len, unsigned heads_inner, const int* valid_len, const unsigned char* key_mask,
                               unsigned always_from, int causal, unsigned causal_offset, float scale, int vec8) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long row = (unsigned long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    // Rows are (head, query) ordered, or (query, head) when heads_inner != 0.
    const unsigned i = heads_inner ? (unsigned)(row / heads_inner) : (unsigned)(row % sq_len);
    const int vl = valid_len ? *valid_len : (int)sk_len;
    const float* sr = scores + row * sk_len;
    T* pr = probs + row * sk_len;
#define VISIBLE(j) (((int)(j) < vl || (j) >= always_from) && (!causal || (j) <= i + causal_offset) && (!key_mask || key_mask[j]))
    float m = -INFINITY;
    if (!ANY || vec8) {
        // C chunks of 8 keys a lane.
        float v[C][8];
        // A chunk's 8 key-mask bytes (a byte of 0 hides its key), as one load where aligned.
        unsigned long long km[C];
        const bool km8 = key_mask && !((size_t)key_mask & 7);
        // As below, the scores' loads come first, independent of the masks'.
#pragma unroll
        for (int t = 0; t < C; ++t) {
            const unsigned j0 = 8 * (lane + 32 * t);
            if (j0 < sk_len) load8(sr + j0, v[t]);
        }
#pragma unroll
        for (int t = 0; t < C; ++t) {
            const unsigned j0 = 8 * (lane + 32 * t);
            km[t] = ~0ull;
            if (j0 < sk_len && key_mask) {
                if (km8) {
                    km[t] = *(const unsigned long long*)(key_mask + j0);
                } else {
                    km[t] = 0;
                    for (int e = 0; e < 8; ++e) km[t] |= (unsigned long long)key_mask[j0 + e] << (8 * e);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < C; ++t) {
            const unsigned j0 = 8 * (lane + 32 * t);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const unsigned j = j0 + e;
                const bool shown = ((int)j < vl || j >= always_from) && (!causal || j <= i + causal_offset) &&
                                   ((km[t] >> (8 * e)) & 0xffu);
                v[t][e] = (j0 < sk_len && shown) ? v[t][e] * scale : -INFINITY;
                m = fmaxf(m, v[t][e]);
            }
        }
        m = warp_max(m);
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < C; ++t)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                v[t][e] = (m != -INFINITY && v[t][e] != -INFINITY) ? expf(v[t][e] - m) : 0.f;
                sum += v[t][e];
            }
        sum = warp_sum(sum);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
        for (int t = 0; t < C; ++t) {
            const unsigned j0 = 8 * (lane + 32 * t);
            if (j0 < sk_len) {
#pragma unroll
                for (int e = 0; e < 8; ++e) v[t][e] *= inv;
                store8(pr + j0, v[t]);
            }
        }
        return;
    }
    if (!ANY) return;
    if (sk_len <= 32 * SOFTMAX_REGS) {
        float v[SOFTMAX_REGS];
        // The scores are loaded whatever the mask says (the product wrote every one), so
        // their loads do not wait for those of the valid length and the key mask.
#pragma unroll
        for (int t = 0; t < SOFTMAX_REGS; ++t) {
            const unsigned j = lane + 32 * t;
            v[t] = j < sk_len ? sr[j] : -INFINITY;
        }
#pragma unroll
        for (int t = 0; t < SOFTMAX_REGS; ++t) {
            const unsigned j = lane + 32 * t;
            v[t] = (j < sk_len && VISIBLE(j)) ? v[t] * scale : -INFINITY;
            m = fmaxf(m, v[t]);
        }
        m = warp_max(m);
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < SOFTMAX_REGS; ++t) {
            v[t] = (m != -INFINITY && v[t] != -INFINITY) ? expf(v[t] - m) : 0.f;
            sum += v[t];
        }
        sum = warp_sum(sum);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
        for (int t = 0; t < SOFTMAX_REGS; ++t) {
            const unsigned j = lane + 32 * t;
            if (j < sk_len) pr[j] = from_f32<T>(v[t] * inv);
        }
        return;
    }
    for (unsigned j = lane; j < sk_len; j += 32)
        if (VISIBLE(j)) m = fmaxf(m, sr[j] * scale);
    m = warp_max(m);
    float sum = 0.f;
    for (unsigned j = lane; j < sk_len; j += 32)
        if (VISIBLE(j) && m != -INFINITY) sum += expf(sr[j] * scale - m);
    sum = warp_sum(sum);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (unsigned j = lane; j < sk_len; j += 32)
        pr[j] = from_f32<T>(VISIBLE(j) && m != -INFINITY ? expf(sr[j] * scale - m) * inv : 0.f);
#undef VISIBLE
}

#define MASKED_SOFTMAX(T, S)                                                                          \
    extern "C" __global__ void masked_softmax_##S(const float* scores, T* probs, unsigned rows,          \
                                                  unsigned sq_len,                                     \
                                                  unsigned sk_len, unsigned heads_inner, const int* valid_len, const unsigned char* key_mask,               \
                                                  unsigned always_from, int causal,                    \
                                                  unsigned causal_offset, float scale, int vec8) {     \
        masked_softmax<T>(scores, probs, rows, sq_len, sk_len, heads_inner, valid_len, key_mask, always_from, causal, causal_offset, scale, vec8); \
    }                                                                                                 \
    extern "C" __global__ void masked_softmax_vec3_##S(const float* scores, T* probs, unsigned rows,    \
                                                       unsigned sq_len, unsigned sk_len,              \
                                                       unsigned heads_inner, const int* valid_len,    \
                                                       const unsigned char* key_mask,                 \
                                                       unsigned always_from, int causal,              \
                                                       unsigned causal_offset, float scale, int vec8) { \
        masked_softmax<T, 3, false>(scores, probs, rows, sq_len, sk_len, heads_inner, valid_len,      \
                                    key_mask, always_from, causal, causal_offset, scale, vec8);       \
    }
FOR_FLOATS(MASKED_SOFTMAX)
