// Camera frames to model pixels (host twin: kernels/src/ops/image.rs).

// resize_pad_pixels: one thread per output pixel (three channels). A separable weighted resize
// of a u8 HWC frame from given tap tables, rounded to u8 (half to even, clamped to [0, 255]),
// placed at (ph, pw) in a th × tw frame of black, then scaled to [-1, 1] as x / 255 · 2 − 1.
// Every sum is formed in the host's order without contraction (__fmul_rn / __fadd_rn), so
// the result equals the host's bit for bit. spans: (first input index, count, start in wts)
// per output row (rh of them), then per output column (rw); a span outside the frame or the
// weights gives a black pixel.
extern "C" __global__ void resize_pad_pixels(
    const unsigned char* __restrict__ src, unsigned h, unsigned w,
    const int* __restrict__ spans, const float* __restrict__ wts, unsigned nw,
    unsigned rh, unsigned rw, unsigned th, unsigned tw, unsigned ph, unsigned pw,
    float* __restrict__ out)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= th * tw) return;
    unsigned y = i / tw, x = i % tw;
    float px[3] = {-1.f, -1.f, -1.f};
    if (y >= ph && y < ph + rh && x >= pw && x < pw + rw) {
        const int* sy = spans + 3 * (y - ph);
        const int* sx = spans + 3 * (rh + x - pw);
        long long fy = sy[0], ny = sy[1], oy = sy[2], fx = sx[0], nx = sx[1], ox = sx[2];
        bool ok = fy >= 0 && ny >= 0 && oy >= 0 && fy + ny <= h && oy + ny <= nw
            && fx >= 0 && nx >= 0 && ox >= 0 && fx + nx <= w && ox + nx <= nw;
        if (ok) {
            float v[3] = {0.f, 0.f, 0.f};
            for (long long j = 0; j < nx; ++j) {
                float r[3] = {0.f, 0.f, 0.f};
                for (long long t = 0; t < ny; ++t) {
                    float a = wts[oy + t];
                    const unsigned char* p = src + ((fy + t) * w + fx + j) * 3;
                    for (int c = 0; c < 3; ++c) r[c] = __fadd_rn(r[c], __fmul_rn(a, (float)p[c]));
                }
                float b = wts[ox + j];
                for (int c = 0; c < 3; ++c) v[c] = __fadd_rn(v[c], __fmul_rn(b, r[c]));
            }
            for (int c = 0; c < 3; ++c) {
                float q = rintf(fminf(fmaxf(v[c], 0.f), 255.f));
                px[c] = __fsub_rn(__fmul_rn(__fdiv_rn(q, 255.f), 2.f), 1.f);
            }
        }
    }
    for (int c = 0; c < 3; ++c) out[3 * i + c] = px[c];
}
