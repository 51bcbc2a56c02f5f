/*
 * Exercises the whole C ABI of libflashrt_exec through the public header.
 *
 *   abi_test host    -- the host backend (CI)
 *   abi_test cuda    -- CUDA device 0
 *
 * The work it captures is backend-neutral: device-to-device copies (frt_buffer_copy) and
 * host functions (frt_launch_host) that count their runs. Data is checked with
 * frt_buffer_upload / frt_buffer_download. Exit status 0 means every check passed.
 */
#include <flashrt/exec.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    frt_last_error());                                                     \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#define CHECK_EQ(a, b) CHECK((a) == (b))

enum { N = 64, BYTES = N * sizeof(float) };

static void bump(void *user) { atomic_fetch_add((atomic_int *)user, 1); }

/* What a record callback needs: it finds the stream id of the native stream it is given. */
struct recording {
    frt_ctx ctx;
    frt_buffer dst, src;
    size_t dst_off, src_off, bytes;
    atomic_int *runs;
    int recorded;
};

static void record_copy(void *user, void *stream) {
    struct recording *r = (struct recording *)user;
    int sid = frt_ctx_wrap_stream(r->ctx, stream);
    if (sid < 0) return;
    if (frt_buffer_copy(r->ctx, r->dst, r->dst_off, r->src, r->src_off, r->bytes, sid) != FRT_OK) return;
    if (r->runs && frt_launch_host(r->ctx, stream, bump, r->runs) != FRT_OK) return;
    r->recorded = 1;
}

static void record_nested(void *user, void *stream) {
    struct recording *r = (struct recording *)user;
    (void)stream;
    frt_graph inner = frt_graph_create(r->ctx, "inner", 0);
    /* A capture inside a capture must fail cleanly. */
    r->recorded = frt_graph_capture(inner, 1, record_copy, r);
    frt_graph_destroy(inner);
}

static void fill(float *v, float x) {
    for (int i = 0; i < N; i++) v[i] = x + (float)i;
}

static int equal(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "host";
    frt_ctx ctx = strcmp(want, "cuda") == 0 ? frt_ctx_create_cuda(0) : frt_ctx_create_host();
    if (!ctx) {
        fprintf(stderr, "cannot create a %s context: %s\n", want, frt_last_error());
        return 2;
    }
    CHECK_EQ(frt_ctx_backend(ctx), strcmp(want, "cuda") == 0 ? 1 : 0);

    /* Null and garbage handles never crash. */
    CHECK_EQ(frt_ctx_stream(NULL, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_ctx_backend((frt_ctx)(uintptr_t)0x1234), FRT_ERR_INVALID);
    CHECK(frt_buffer_alloc(NULL, "x", 4) == NULL);
    CHECK(frt_buffer_dptr(NULL) == NULL);
    CHECK_EQ(frt_buffer_bytes(NULL), 0u);
    CHECK(frt_buffer_name(NULL) != NULL && strcmp(frt_buffer_name(NULL), "") == 0);
    CHECK_EQ(frt_graph_replay(NULL, 0, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_graph_has_variant(NULL, 0), 0); /* "no", as FlashRT's */
    CHECK_EQ(frt_graph_variant_count(NULL), 0u);
    CHECK_EQ(frt_plan_execute(NULL, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_event_record(NULL, 0), FRT_ERR_INVALID);
    frt_event_destroy(NULL);
    frt_graph_destroy(NULL);
    frt_plan_destroy(NULL);
    frt_ctx_destroy(NULL);
    CHECK(strcmp(frt_status_string(FRT_ERR_NO_VARIANT), "FRT_ERR_NO_VARIANT") == 0);
    CHECK(strlen(frt_last_error()) > 0);

    /* Streams. */
    int s_lo = frt_ctx_stream(ctx, 0);
    int s_hi = frt_ctx_stream(ctx, -5);
    CHECK(s_lo >= 1 && s_hi >= 1 && s_lo != s_hi);
    /* Out-of-range priorities are clamped into the device's range (as FlashRT's). */
    int s_clamped_lo = frt_ctx_stream(ctx, 1);
    int s_clamped_hi = frt_ctx_stream(ctx, -100);
    CHECK(s_clamped_lo >= 1 && s_clamped_hi >= 1);
    void *native_hi = frt_ctx_native_stream(ctx, s_hi);
    CHECK_EQ(frt_ctx_wrap_stream(ctx, native_hi), s_hi);
    CHECK(frt_ctx_native_stream(ctx, 9999) == NULL);
    CHECK_EQ(frt_stream_sync(ctx, 9999), FRT_ERR_INVALID);
    CHECK_EQ(frt_stream_sync(ctx, -1), FRT_ERR_INVALID);
    CHECK_EQ(frt_stream_sync(ctx, 0), FRT_OK);

    /* Buffers: alloc, name, size, upload/download with offsets, copies. */
    frt_buffer a = frt_buffer_alloc(ctx, "a", BYTES);
    frt_buffer b = frt_buffer_alloc(ctx, "b", BYTES);
    frt_buffer c = frt_buffer_alloc(ctx, "c", BYTES);
    CHECK(a && b && c);
    CHECK(frt_buffer_alloc(ctx, "empty", 0) == NULL);
    /* A null name is the empty name; wrapping zero bytes is allowed (as FlashRT's). */
    frt_buffer unnamed = frt_buffer_alloc(ctx, NULL, 4);
    CHECK(unnamed != NULL && strcmp(frt_buffer_name(unnamed), "") == 0);
    frt_buffer none = frt_buffer_wrap(ctx, "none", frt_buffer_dptr(a), 0);
    CHECK(none != NULL && frt_buffer_bytes(none) == 0);
    CHECK_EQ(frt_buffer_copy(ctx, none, 0, a, 0, 4, s_lo), FRT_ERR_INVALID);
    CHECK(frt_buffer_wrap(ctx, "null", NULL, 4) == NULL);
    frt_graph unnamed_g = frt_graph_create(ctx, NULL, 0);
    CHECK(unnamed_g != NULL);
    frt_graph_destroy(unnamed_g);
    CHECK(strcmp(frt_buffer_name(a), "a") == 0);
    CHECK_EQ(frt_buffer_bytes(a), (size_t)BYTES);
    CHECK(frt_buffer_dptr(a) != NULL && frt_buffer_dptr(a) != frt_buffer_dptr(b));
    float in[N], out[N], want_v[N];
    fill(in, 1.0f);
    CHECK_EQ(frt_buffer_upload(a, 0, in, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_buffer_download(a, 0, out, BYTES, s_lo), FRT_OK);
    CHECK(equal(in, out, N));
    CHECK_EQ(frt_buffer_upload(a, BYTES - 4, in, 8, s_lo), FRT_ERR_INVALID);
    float zeros[N] = {0};
    CHECK_EQ(frt_buffer_upload(b, 0, zeros, BYTES, s_lo), FRT_OK);
    /* b[8..16) = a[4..12) */
    CHECK_EQ(frt_buffer_copy(ctx, b, 8 * 4, a, 4 * 4, 8 * 4, s_lo), FRT_OK);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_lo), FRT_OK);
    memset(want_v, 0, sizeof want_v);
    memcpy(want_v + 8, in + 4, 8 * sizeof(float));
    CHECK(equal(out, want_v, N));
    CHECK_EQ(frt_buffer_copy(ctx, b, BYTES - 4, a, 0, 8, s_lo), FRT_ERR_INVALID);
    CHECK_EQ(frt_buffer_copy(ctx, b, 0, a, BYTES, 1, s_lo), FRT_ERR_INVALID);
    CHECK_EQ(frt_buffer_copy(ctx, b, 0, a, 0, 4, 777), FRT_ERR_INVALID);
    /* Wrapped memory: a view of the second half of `a`. */
    frt_buffer half = frt_buffer_wrap(ctx, "a_hi", (char *)frt_buffer_dptr(a) + BYTES / 2, BYTES / 2);
    CHECK(half != NULL);
    CHECK(frt_buffer_wrap(ctx, "null", NULL, 4) == NULL);
    CHECK_EQ(frt_buffer_download(half, 0, out, BYTES / 2, s_lo), FRT_OK);
    CHECK(equal(out, in + N / 2, N / 2));

    /* Events. */
    frt_event ev = frt_ctx_event(ctx);
    CHECK(ev != NULL);
    CHECK_EQ(frt_stream_wait(ctx, s_hi, ev), FRT_OK); /* never recorded: a no-op */
    CHECK_EQ(frt_buffer_copy(ctx, c, 0, a, 0, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_event_record(ev, s_lo), FRT_OK);
    CHECK_EQ(frt_stream_wait(ctx, s_hi, ev), FRT_OK);
    CHECK_EQ(frt_buffer_copy(ctx, b, 0, c, 0, BYTES, s_hi), FRT_OK);
    CHECK_EQ(frt_event_sync(ev), FRT_OK);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_hi), FRT_OK);
    CHECK(equal(out, in, N));
    CHECK_EQ(frt_event_record(ev, 4242), FRT_ERR_INVALID);

    /* Graphs: ports, capture, replay, missing keys, LRU, eviction. */
    frt_graph g = frt_graph_create(ctx, "copy_a_to_b", 2);
    CHECK(g != NULL);
    frt_buffer port = NULL;
    CHECK_EQ(frt_graph_port(g, "in", &port), FRT_ERR_UNBOUND);
    CHECK_EQ(frt_graph_bind(g, "in", a), FRT_OK);
    CHECK_EQ(frt_graph_bind(g, "out", b), FRT_OK);
    CHECK_EQ(frt_graph_port(g, "in", &port), FRT_OK);
    CHECK(port == a);
    atomic_int runs = 0;
    struct recording r1 = {ctx, b, a, 0, 0, BYTES / 2, &runs, 0};
    CHECK_EQ(frt_graph_capture(g, 1, record_copy, &r1), FRT_OK);
    CHECK(r1.recorded);
    struct recording r2 = {ctx, b, a, BYTES / 2, BYTES / 2, BYTES / 2, &runs, 0};
    CHECK_EQ(frt_graph_capture(g, 2, record_copy, &r2), FRT_OK);
    CHECK_EQ(frt_graph_variant_count(g), 2u);
    CHECK_EQ(frt_graph_has_variant(g, 1), 1);
    CHECK_EQ(frt_graph_has_variant(g, 3), 0);
    CHECK_EQ(frt_stream_sync(ctx, s_lo), FRT_OK);
    CHECK_EQ(atomic_load(&runs), 0); /* capturing runs nothing */
    CHECK_EQ(frt_buffer_upload(b, 0, zeros, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(g, 1, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(g, 2, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(g, 3, s_lo), FRT_ERR_NO_VARIANT);
    CHECK_EQ(frt_graph_replay(g, 1, 9999), FRT_ERR_INVALID);
    CHECK_EQ(frt_stream_sync(ctx, s_lo), FRT_OK);
    CHECK_EQ(atomic_load(&runs), 2);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_lo), FRT_OK);
    CHECK(equal(out, in, N));
    /* Binding after capturing is a record (as FlashRT's): the port names the new buffer,
     * and the captured work is not re-pointed (it still copies a into b). */
    CHECK_EQ(frt_graph_bind(g, "in", c), FRT_OK);
    CHECK_EQ(frt_graph_bind(g, "extra", c), FRT_OK);
    CHECK_EQ(frt_graph_port(g, "in", &port), FRT_OK);
    CHECK(port == c);
    CHECK_EQ(frt_buffer_upload(b, 0, zeros, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(g, 1, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(g, 2, s_lo), FRT_OK);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_lo), FRT_OK);
    CHECK(equal(out, in, N));
    CHECK_EQ(frt_graph_bind(g, "in", a), FRT_OK);
    CHECK_EQ(frt_graph_bind(g, NULL, c), FRT_ERR_INVALID);
    /* LRU: key 1 was replayed before key 2, so capturing key 3 evicts key 1. */
    struct recording r3 = {ctx, c, a, 0, 0, BYTES, NULL, 0};
    CHECK_EQ(frt_graph_capture(g, 3, record_copy, &r3), FRT_OK);
    CHECK_EQ(frt_graph_variant_count(g), 2u);
    CHECK_EQ(frt_graph_has_variant(g, 1), 0);
    CHECK_EQ(frt_graph_replay(g, 1, s_lo), FRT_ERR_NO_VARIANT);
    CHECK_EQ(frt_graph_capture(g, FRT_KEY_INHERIT, record_copy, &r3), FRT_ERR_INVALID);
    CHECK_EQ(frt_graph_capture(g, 4, NULL, &r3), FRT_ERR_INVALID);
    struct recording nested = {ctx, c, a, 0, 0, BYTES, NULL, 0};
    frt_graph outer = frt_graph_create(ctx, "outer", 0);
    CHECK_EQ(frt_graph_capture(outer, 5, record_nested, &nested), FRT_OK);
    CHECK_EQ(nested.recorded, FRT_ERR_INVALID);
    frt_graph_destroy(outer);

    /* Adopt: another graph replays g's executable graph for key 2 without owning it. */
    void *exec2 = frt_graph_native_exec(g, 2);
    CHECK(exec2 != NULL);
    CHECK(frt_graph_native_exec(g, 77) == NULL);
    frt_graph adopter = frt_graph_create(ctx, "adopter", 0);
    CHECK_EQ(frt_graph_adopt(adopter, 20, exec2), FRT_OK);
    CHECK_EQ(frt_graph_adopt(adopter, 21, NULL), FRT_ERR_INVALID);
    CHECK_EQ(frt_buffer_upload(b, 0, zeros, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_graph_replay(adopter, 20, s_lo), FRT_OK);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_lo), FRT_OK);
    CHECK(equal(out + N / 2, in + N / 2, N / 2));
    CHECK_EQ(frt_graph_evict(adopter, 20), FRT_OK);
    CHECK_EQ(frt_graph_evict(adopter, 20), FRT_ERR_NO_VARIANT);
    CHECK_EQ(frt_graph_evict_lru(adopter), FRT_ERR_NO_VARIANT);
    CHECK_EQ(frt_graph_replay(g, 2, s_lo), FRT_OK); /* still owned and alive in g */
    frt_graph_destroy(adopter);
    CHECK_EQ(frt_graph_replay(adopter, 20, s_lo), FRT_ERR_INVALID); /* stale handle */

    /* Plan: copy a -> c on s_lo (graph g key 3), then c -> b on s_hi after it. */
    frt_graph g2 = frt_graph_create(ctx, "copy_c_to_b", 0);
    struct recording r4 = {ctx, b, c, 0, 0, BYTES, &runs, 0};
    CHECK_EQ(frt_graph_capture(g2, 7, record_copy, &r4), FRT_OK);
    frt_plan p = frt_plan_create(ctx);
    CHECK(p != NULL);
    int n0 = frt_plan_add(p, g, FRT_KEY_INHERIT, s_lo);
    int n1 = frt_plan_add(p, g2, 7, s_hi);
    CHECK(n0 == 0 && n1 == 1);
    CHECK_EQ(frt_plan_add(p, g2, 7, 5000), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_add(p, NULL, 7, s_hi), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_after(p, n0, n1), FRT_ERR_INVALID); /* a later node: would allow cycles */
    CHECK_EQ(frt_plan_after(p, n1, n1), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_after(p, n1, 9), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_after(p, -1, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_after(p, n1, n0), FRT_OK);
    CHECK_EQ(frt_buffer_upload(c, 0, zeros, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_buffer_upload(b, 0, zeros, BYTES, s_lo), FRT_OK);
    CHECK_EQ(frt_stream_sync(ctx, s_lo), FRT_OK);
    CHECK_EQ(frt_plan_execute(p, 99), FRT_ERR_NO_VARIANT); /* node 0 inherits a missing key */
    CHECK_EQ(frt_plan_execute(p, FRT_KEY_INHERIT), FRT_ERR_NO_VARIANT); /* as FlashRT's */
    int before = atomic_load(&runs);
    CHECK_EQ(frt_plan_execute(p, 3), FRT_OK);
    CHECK_EQ(frt_plan_sync(p), FRT_OK);
    CHECK_EQ(atomic_load(&runs), before + 1);
    CHECK_EQ(frt_buffer_download(b, 0, out, BYTES, s_hi), FRT_OK);
    CHECK(equal(out, in, N));

    /* Eviction through the ABI, then a context-wide sync. */
    CHECK_EQ(frt_graph_evict_lru(g), FRT_OK);
    CHECK_EQ(frt_graph_variant_count(g), 1u);
    CHECK_EQ(frt_ctx_sync(ctx), FRT_OK);

    /* Destroying the context makes every handle made from it stale. */
    frt_ctx_destroy(ctx);
    CHECK_EQ(frt_ctx_stream(ctx, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_graph_replay(g, 2, 0), FRT_ERR_INVALID);
    CHECK_EQ(frt_plan_execute(p, 3), FRT_ERR_INVALID);
    CHECK(frt_buffer_dptr(a) == NULL);
    CHECK_EQ(frt_event_sync(ev), FRT_ERR_INVALID);
    frt_plan_destroy(p); /* destroying stale handles is harmless */
    frt_graph_destroy(g);
    frt_event_destroy(ev);

    if (failures) {
        fprintf(stderr, "C ABI (%s): %d check(s) failed\n", want, failures);
        return 1;
    }
    printf("C ABI (%s): all checks passed\n", want);
    return 0;
}
