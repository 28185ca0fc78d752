/* decode_vs_read.c - decode speed against a plain read of the same weight bytes, token by token.
 *
 * Build: make build/decode_vs_read (bench.sh and make test do this)
 * Run:
 *   build/decode_vs_read MODEL.bin [--ids 2,818,...] [-n 64] [--threads N] [--hugepages] [--profile]
 *
 * The ceiling of a weight-streaming decoder is (read bandwidth) / (bytes one step reads). On a shared
 * host the bandwidth moves by tens of percent within seconds, so a figure measured before or after a
 * run compares the run with another machine. Here the two alternate: after the prompt (--ids, bench.sh
 * passes the ids of its runs; default: BOS alone), each of n greedy decode steps (zaya_forward) is followed
 * by one plain read of the weight bytes a decode step reads, in the same process, from the same
 * (huge-page) memory, with the same number of threads, in the same order (layer 0 .. LM head):
 *   per layer every attention, router, norm and residual-scale tensor and ONE expert's gate_up and
 *   down rows (with their int8 scales), then the whole LM head, the final norm and one embedding row
 * (the bytes of bench/bytes_per_token.py, which this checks: the totals must agree). The read splits
 * those bytes into T contiguous equal shares, one per thread, summed as 64-bit words by the read loop
 * of bench/bandwidth.c (read_sum.h). Each step's pair is a few tens of milliseconds apart.
 *
 * stdout, one machine-readable line:
 *   decode_vs_read threads=1 steps=64 bytes_per_token=1490612320 decode_tok/s=15.2 read_GB/s=30.1
 *       ceiling_tok/s=20.2 ratio=0.75 ratio_median=0.76 ratio_min=0.70 ratio_max=0.80
 * ratio = total read time / total decode time (= decode tok/s / ceiling tok/s); the per-step ratios
 * give the median, min and max. A skip-expert layer reads no expert in decode, so the read is the
 * upper bound of a step and the ratio a lower bound. Errors: a message on stderr, exit 1; usage: 2.
 *
 * --profile: then n more greedy steps (no reads between them) with a tap callback that notes the
 * time at every intermediate tensor, and a table of where a step goes: the time between each pair of
 * consecutive taps (e.g. "input_layernorm -> self_attn.qkv_proj.q_proj" is the q/k/v product), summed
 * over the layers, in ms per token, in the order of a step. The callback's own cost (a clock read
 * per tap) is in those steps' time, not in the paired line above.
 *
 * The engine's threads (--threads N, default: the cores this process may use) are its own; the plain
 * read runs on N OpenMP threads.
 */
#define _POSIX_C_SOURCE 200809L
#include "zaya.h"
#include "kernels.h"   /* the pool's counts */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "read_sum.h"   /* the read loop of bandwidth.c */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *msg, const char *detail) {
    fprintf(stderr, "decode_vs_read: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* ---------------------------------------------------------------- the bytes of one decode step */
typedef struct { const unsigned char *p; size_t n; } Range;
typedef struct { Range *r; int n, cap; size_t bytes; } Ranges;

static void add(Ranges *rs, const void *p, size_t n) {
    if (!p || !n) return;
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 1024;
        rs->r = realloc(rs->r, sizeof *rs->r * (size_t)rs->cap);
        if (!rs->r) die("out of memory", NULL);
    }
    rs->r[rs->n++] = (Range){p, n};
    rs->bytes += n;
}

static void add_vector(Ranges *rs, const float *v, int n) { add(rs, v, sizeof(float) * (size_t)n); }

/* rows [row0, row0 + nrows) of a matrix: its values and, for int8, their group scales (FP8: one
 * scale per row; MXFP4: half a byte per value and one E8M0 byte per 32 values) */
static void add_rows(Ranges *rs, const ZayaMatrix *w, int row0, int nrows) {
    const size_t first = (size_t)row0 * (size_t)w->cols, count = (size_t)nrows * (size_t)w->cols;
    if (w->dtype == ZAYA_MXFP4) {
        add(rs, (const unsigned char *)w->data + first / 2, count / 2);
        add(rs, w->exponents + first / 32, count / 32);
        return;
    }
    const size_t esize = w->dtype == ZAYA_F32 ? 4 : w->dtype == ZAYA_BF16 ? 2 : 1;
    add(rs, (const unsigned char *)w->data + first * esize, count * esize);
    if (w->dtype == ZAYA_Q8) add(rs, w->scales + first / (size_t)w->group_size, sizeof(float) * (count / (size_t)w->group_size));
    if (w->dtype == ZAYA_FP8) add(rs, w->scales + row0, sizeof(float) * (size_t)nrows);
}
static void add_matrix(Ranges *rs, const ZayaMatrix *w) { add_rows(rs, w, 0, w->rows); }

static void add_residual_scale(Ranges *rs, const ZayaResidualScale *p, int H) {
    add_vector(rs, p->hidden_states_scale, H);
    add_vector(rs, p->hidden_states_bias, H);
    add_vector(rs, p->residual_scale, H);
    add_vector(rs, p->residual_bias, H);
}

static Ranges step_ranges(const ZayaModel *m) {
    const ZayaConfig *c = &m->config;
    const int H = c->hidden_size, d = c->head_dim, C = (c->num_heads + c->num_kv_heads) * d;
    const int R = c->router_hidden, E = c->num_experts, I = c->moe_intermediate;
    Ranges rs = {0};
    add_rows(&rs, &m->embed_tokens, 0, 1);                  /* the input token's embedding row */
    add_vector(&rs, m->input_hidden_states_scale, H);
    add_vector(&rs, m->input_hidden_states_bias, H);
    for (int l = 0; l < c->num_layers; l++) {
        const ZayaLayer *L = &m->layers[l];
        add_vector(&rs, L->input_layernorm, H);
        add_matrix(&rs, &L->q_proj);
        add_matrix(&rs, &L->k_proj);
        add_matrix(&rs, &L->v_proj_current);
        add_matrix(&rs, &L->v_proj_delayed);
        add_vector(&rs, L->q_proj_bias, c->num_heads * d);   /* attention_bias (NULL without: nothing) */
        add_vector(&rs, L->k_proj_bias, c->num_kv_heads * d);
        add_vector(&rs, L->v_proj_current_bias, c->num_kv_heads * d / 2);
        add_vector(&rs, L->v_proj_delayed_bias, c->num_kv_heads * d / 2);
        add_vector(&rs, L->conv_qk_depthwise_weight, C * c->cca_time0);
        add_vector(&rs, L->conv_qk_depthwise_bias, C);
        add_vector(&rs, L->conv_qk_grouped_weight, C * d * c->cca_time1);
        add_vector(&rs, L->conv_qk_grouped_bias, C);
        add_vector(&rs, L->qk_norm_temp, c->num_kv_heads);
        add_matrix(&rs, &L->o_proj);
        add_vector(&rs, L->o_proj_bias, H);
        add_residual_scale(&rs, &L->post_attention_residual_scale, H);
        add_vector(&rs, L->post_attention_layernorm, H);
        add_matrix(&rs, &L->router_down_proj);
        add_vector(&rs, L->router_down_proj_bias, R);
        add_vector(&rs, L->router_states_scale, R);        /* NULL at layer 0: adds nothing */
        add_vector(&rs, L->router_norm, R);
        add_matrix(&rs, &L->router_fc1);
        add_vector(&rs, L->router_fc1_bias, R);
        add_matrix(&rs, &L->router_fc2);
        add_vector(&rs, L->router_fc2_bias, R);
        add_matrix(&rs, &L->router_out_proj);
        add_vector(&rs, L->balancing_biases, E + 1);
        const int e = l % E;                               /* one expert: any one has the same bytes */
        add_rows(&rs, &L->experts_gate_up, e * 2 * I, 2 * I);
        add_rows(&rs, &L->experts_down, e * H, H);
        add_residual_scale(&rs, &L->post_mlp_residual_scale, H);
    }
    add_vector(&rs, m->norm, H);
    add_matrix(&rs, &m->embed_tokens);                      /* the tied LM head, all rows */
    add_vector(&rs, m->lm_head_bias, c->vocab_size);        /* lm_head_bias (NULL without: nothing) */
    return rs;
}

/* ---------------------------------------------------------------- the plain read */
/* bytes [from, to) of the concatenated ranges */
static uint64_t read_share(const Ranges *rs, size_t from, size_t to) {
    uint64_t s = 0;
    size_t base = 0;
    for (int i = 0; i < rs->n && base < to; base += rs->r[i++].n) {
        const size_t a = from > base ? from - base : 0, b = to - base < rs->r[i].n ? to - base : rs->r[i].n;
        if (a < b) s += read_sum(rs->r[i].p + a, b - a);
    }
    return s;
}

static volatile uint64_t sink;   /* keeps the sums alive */

static double read_pass(const Ranges *rs) {
    const double t0 = now_s();
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
        int me = 0, nth = 1;
#ifdef _OPENMP
        me = omp_get_thread_num(), nth = omp_get_num_threads();
#endif
        total += read_share(rs, rs->bytes * (size_t)me / (size_t)nth, rs->bytes * (size_t)(me + 1) / (size_t)nth);
    }
    sink += total;
    return now_s() - t0;
}

/* ---------------------------------------------------------------- main */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int greedy(const ZayaModel *m, const ZayaState *s) {   /* the next token: argmax of the logits */
    int next = 0;
    for (int v = 1; v < m->config.vocab_size; v++) if (s->logits[v] > s->logits[next]) next = v;
    return next;
}

/* ---------------------------------------------------------------- --profile */
#define MAX_SEGMENTS 512
typedef struct { const char *from, *to; double s; } Segment;   /* time between two consecutive taps */
typedef struct {
    Segment seg[MAX_SEGMENTS];
    int n, cur;        /* segments so far; the last one timed */
    const char *last;  /* the name of the last tap (or "(step start)") */
    double t;          /* and its time */
} Profile;

static void profile_mark(Profile *p, const char *name) {
    const double t = now_s();
    int i = (p->cur + 1) % MAX_SEGMENTS;   /* a step repeats per layer: nearly always the next one */
    if (i >= p->n || strcmp(p->seg[i].from, p->last) || strcmp(p->seg[i].to, name))
        for (i = 0; i < p->n && (strcmp(p->seg[i].from, p->last) || strcmp(p->seg[i].to, name)); i++) {}
    if (i == p->n) {
        if (p->n == MAX_SEGMENTS) die("--profile: more than MAX_SEGMENTS (512) distinct pairs of consecutive taps", "hint: raise it in bench/decode_vs_read.c");
        p->seg[p->n++] = (Segment){p->last, name, 0};
    }
    p->seg[i].s += t - p->t;
    p->cur = i;
    p->last = name;   /* tap names are string literals of the engine */
    p->t = now_s();   /* the bookkeeping above is not counted */
}

static void profile_tap(void *ctx, const ZayaTap *tap) { profile_mark(ctx, tap->name); }

static void profile(const ZayaModel *m, ZayaState *s, int steps) {
    static Profile p;
    char err[1024];
    double total = 0;
    s->tap = profile_tap;
    s->tap_ctx = &p;
    for (int i = 0; i < steps; i++) {
        const int next = greedy(m, s);
        p.last = "(step start)";
        p.t = now_s();
        const double t0 = p.t;
        if (zaya_forward(m, s, &next, 1, err, sizeof err) != 0) die(err, NULL);
        profile_mark(&p, "(step end)");
        total += now_s() - t0;
    }
    s->tap = NULL;
    double sum = 0;
    for (int i = 0; i < p.n; i++) sum += p.seg[i].s;
    printf("profile steps=%d ms/token=%.3f taps_ms/token=%.3f (between consecutive taps, summed over the layers)\n",
           steps, 1e3 * total / steps, 1e3 * sum / steps);
    for (int i = 0; i < p.n; i++)
        printf("%9.3f ms %5.1f %%  %s -> %s\n", 1e3 * p.seg[i].s / steps, 100 * p.seg[i].s / sum, p.seg[i].from, p.seg[i].to);
}

static void usage(void) {
    fprintf(stderr, "usage: decode_vs_read MODEL.bin [--ids 2,818,...] [-n 64] [--threads N] [--hugepages] [--profile]\n");
    exit(2);
}

static long arg_long(const char *flag, const char *v, long lo, long hi) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "decode_vs_read: %s needs a number in %ld..%ld (got '%s')\n", flag, lo, hi, v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv) {
    /* libgomp's idle threads spin after the read for many milliseconds, competing with the engine's own
     * threads for the cores; passive ones sleep. The policy is read at start-up, hence the re-exec. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);   /* returns only on failure: then run as we are */
    }
    const char *path = NULL, *id_list = NULL;
    int steps = 64, threads = 0, huge = 0, want_profile = 0;   /* huge: --hugepages' copy, else ./zaya's default load */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-n") && i + 1 < argc) steps = (int)arg_long(a, argv[++i], 1, 100000);
        else if (!strcmp(a, "--ids") && i + 1 < argc) id_list = argv[++i];
        else if (!strcmp(a, "--threads") && i + 1 < argc) threads = (int)arg_long(a, argv[++i], 1, 1024);
        else if (!strcmp(a, "--hugepages")) huge = 1;
        else if (!strcmp(a, "--profile")) want_profile = 1;
        else if (a[0] != '-' && !path) path = a;
        else usage();
    }
    if (!path) usage();
    /* the prompt: comma-separated ids (range-checked by zaya_forward), or BOS alone;
     * read before the load, which takes seconds for the 8B blob */
    int prompt = 1;
    char *end;
    for (const char *c = id_list; c && *c; c++) prompt += *c == ',';
    int *ids = malloc(sizeof(int) * (size_t)prompt);
    if (!ids) die("out of memory", NULL);
    const char *v = id_list;
    for (int i = 0; id_list && i < prompt; i++, v = end + 1) {   /* strtol's end is the next ',' */
        end = NULL;
        const long x = strtol(v, &end, 10);
        if (end == v || (*end && *end != ',') || x < 0 || x > 2147483647L) {
            fprintf(stderr, "decode_vs_read: --ids: item %d is not a token id (got '%.20s')\n", i + 1, v);
            exit(2);
        }
        ids[i] = (int)x;
    }
    char err[1024];
    ZayaModel m;
    ZayaState s;
    if (zaya_load(&m, path, huge ? ZAYA_LOAD_HUGEPAGES : 0, err, sizeof err) != 0) die(err, NULL);
    if (!id_list) ids[0] = m.config.bos_id;
    if (zaya_state_init(&s, &m, prompt + (1 + want_profile) * steps + 1, threads, err, sizeof err) != 0) die(err, NULL);
    threads = zaya_state_threads(&s);
#ifdef _OPENMP
    omp_set_num_threads(threads);   /* the plain read: as many threads as the engine */
#endif
    const Ranges rs = step_ranges(&m);
    if (zaya_forward(&m, &s, ids, prompt, err, sizeof err) != 0) die(err, NULL);
    read_pass(&rs);   /* warm-up */

    double *ratio = malloc(sizeof(double) * (size_t)steps), t_decode = 0, t_read = 0;
    if (!ratio) die("out of memory", NULL);
    for (int i = 0; i < steps; i++) {
        const int next = greedy(&m, &s);
        const double t0 = now_s();
        if (zaya_forward(&m, &s, &next, 1, err, sizeof err) != 0) die(err, NULL);
        const double td = now_s() - t0, tr = read_pass(&rs);
        t_decode += td;
        t_read += tr;
        ratio[i] = tr / td;
    }
    qsort(ratio, (size_t)steps, sizeof *ratio, cmp_double);
    const double tok_s = steps / t_decode, gbs = rs.bytes * (double)steps / t_read / 1e9;
    printf("decode_vs_read threads=%d steps=%d bytes_per_token=%zu decode_tok/s=%.2f read_GB/s=%.2f "
           "ceiling_tok/s=%.2f ratio=%.3f ratio_median=%.3f ratio_min=%.3f ratio_max=%.3f\n",
           threads, steps, rs.bytes, tok_s, gbs, gbs * 1e9 / rs.bytes, t_read / t_decode,
           ratio[steps / 2], ratio[0], ratio[steps - 1]);
    char line[256];   /* whether the engine's threads ran */
    kernels_pool_report(s.kernels, line, sizeof line);
    fprintf(stderr, "%s\n", line);
    if (want_profile) profile(&m, &s, steps);
    free(ratio);
    free(ids);
    free(rs.r);
    zaya_state_free(&s);
    zaya_free(&m);
    return 0;
}
