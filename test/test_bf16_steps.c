/* test_bf16_steps.c - each step of forward(), in bf16, fed the official bf16 run's own inputs.
 *
 *   make build/test_bf16_steps && build/test_bf16_steps BLOB GOLDEN_BF16 [PRECISION]
 *
 * BLOB is test/fixtures/checkpoint_native exported (any dtype holding its bf16 weights exactly: bf16
 * or fp32), GOLDEN_BF16 test/fixtures/golden_bf16: the official code loaded in bfloat16, one .npy per
 * tap (taps/NAME.npy, float32 files holding bf16 values). For every layer, every step of zaya.c
 * (included whole, so its static steps can be called one by one) runs on the official inputs of that
 * step and its output is compared with the official output, element by element:
 *   - elementwise, norm, softmax and activation steps must be bit-identical;
 *   - products (Linear, the convolutions, attention's q.k and p.v) may differ by 1 bf16 ulp on at
 *     most 1% of the elements: a float32 sum in another order rounds to the neighbouring bf16.
 * Each line says how many elements differ. PRECISION (as ./zaya --precision) defaults to bf16-torch1.13,
 * the torch that made the fixture (docs/bf16.md); with placements (+fp32-residual, +fp32-norm,
 * +fp32-logits) the steps they move differ and every other step stays within its bound (test_bf16.py). Exit status 1 if any check fails, 2 on usage or load errors.
 */
#include "../zaya.c"

#include <stdint.h>

static int failures = 0, checks = 0;
static const char *golden;

/* A float32 or int32 .npy [rows, cols] (C or Fortran order) of the golden folder (tap: taps/TAP.npy, else
 * FILE.npy at its top) read row-major into a new array; NULL if absent. */
static float *read_npy_at(const char *tap, int top, int *rows, int *cols) {
    char path[1024], head[512];
    snprintf(path, sizeof path, "%s/%s%s.npy", golden, top ? "" : "taps/", tap);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) || pre[6] != 1) { fclose(f); return NULL; }
    const size_t hlen = pre[8] | (size_t)pre[9] << 8;
    if (hlen >= sizeof head || fread(head, 1, hlen, f) != hlen) { fclose(f); return NULL; }
    head[hlen] = 0;
    const int fortran = strstr(head, "'fortran_order': True") != NULL;
    const char *sh = strstr(head, "'shape': (");
    long d[3] = {1, 1, 1};
    int nd = sh ? sscanf(sh + 10, "%ld, %ld, %ld", &d[0], &d[1], &d[2]) : 0;
    const int is_int = strstr(head, "'<i4'") != NULL;
    if ((!strstr(head, "'<f4'") && !is_int) || nd < 1) { fclose(f); return NULL; }
    *rows = (int)d[0];
    *cols = (int)(nd == 1 ? 1 : d[1] * (nd == 3 ? d[2] : 1));
    const size_t n = (size_t)*rows * *cols;
    float *raw = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
    if (!raw || !x || fread(raw, sizeof(float), n, f) != n) { fclose(f); free(raw); free(x); return NULL; }
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        const float *at = fortran && nd == 2 ? &raw[(i % *cols) * *rows + i / *cols] : &raw[i];
        int32_t v;
        memcpy(&v, at, 4);
        x[i] = is_int ? (float)v : *at;
    }
    free(raw);
    return x;
}
static float *read_npy(const char *tap, int *rows, int *cols) { return read_npy_at(tap, 0, rows, cols); }

/* A tap that must exist: [rows, cols] with rows = T; exits with status 2 if it does not. */
static float *need(const char *tap, int T, int cols_expected) {
    int rows, cols;
    float *x = read_npy(tap, &rows, &cols);
    if (!x || rows < T || (cols_expected && cols != cols_expected)) {
        printf("FAIL %s: golden tap %s/taps/%s.npy missing or not [%d, %d] (found [%d, %d])\n", tap, golden, tap, T,
               cols_expected, x ? rows : 0, x ? cols : 0);
        exit(2);
    }
    return x;
}

static float *layer_tap(int layer, const char *name, int T, int cols) {
    char tap[256];
    snprintf(tap, sizeof tap, "model.layers.%d.%s", layer, name);
    return need(tap, T, cols);
}

/* Compares `len` values of n rows (ours stride apart, theirs packed): products may differ by one bf16
 * ulp on <= 1% of the elements, everything else must be bit-identical. */
enum { EXACT = 0, PRODUCT = 1 };
static void compare_rows(int layer, const char *step, int kind, const float *ours, int stride, const float *theirs, int len,
                         int n) {
    size_t differ = 0, total = (size_t)len * n;
    int max_ulp = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < len; i++) {
            const float a = ours[(size_t)t * stride + i], b = theirs[(size_t)t * len + i];
            if (a == b || (a != a && b != b)) continue;
            int32_t ia, ib;
            memcpy(&ia, &a, 4);
            memcpy(&ib, &b, 4);
            const int ulp = abs((ia >> 16) - (ib >> 16));
            differ++;
            max_ulp = ulp > max_ulp ? ulp : max_ulp;
        }
    const int ok = kind == EXACT ? differ == 0 : max_ulp <= 1 && differ * 100 <= total;
    checks++;
    failures += !ok;
    char where[16];
    snprintf(where, sizeof where, layer < 0 ? "model" : "layer %d", layer);
    printf("%s %s %-46s %s: %zu of %zu elements differ (max %d bf16 ulp)\n", ok ? "PASS" : "FAIL", where, step,
           kind == EXACT ? "bit-identical" : "product, <= 1 ulp on <= 1%", differ, total, max_ulp);
}

/* Captures the attention probabilities the self_attention step reports ([nq, keys] per position). */
typedef struct { float *probs; int nq, T; } AttnCapture;
static void capture_attn(void *ctx, const ZayaTap *tap) {
    AttnCapture *a = ctx;
    if (strcmp(tap->name, "self_attn:attn_weights")) return;
    const int keys = tap->shape[1], first = tap->pos - keys + 1;
    for (int n = 0; n < a->nq; n++)   /* into [T, nq, T]: the masked keys stay 0, as in HF's weights */
        memcpy(a->probs + ((size_t)tap->pos * a->nq + n) * a->T + first, (const float *)tap->data + (size_t)n * keys,
               sizeof(float) * (size_t)keys);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_bf16_steps BLOB GOLDEN_BF16 [bf16|bf16-torch1.13[+fp32-residual][+fp32-norm][+fp32-logits]]\n");
        return 2;
    }
    golden = argv[2];
    char err[1024];
    int precision = ZAYA_PRECISION_BF16_TORCH113, placement = 0;
    if (argc > 3 && (zaya_parse_precision(argv[3], &precision, &placement, err, sizeof err) != 0 ||
                     precision == ZAYA_PRECISION_FP32)) {
        fprintf(stderr, "test_bf16_steps: %s\n", precision == ZAYA_PRECISION_FP32 ? "a bf16 precision is needed" : err);
        return 2;
    }
    ZayaModel m;
    ZayaState s;
    int T, cols;
    float *e_tap = read_npy("model.embed_tokens", &T, &cols);
    if (!e_tap) { fprintf(stderr, "test_bf16_steps: %s/taps/model.embed_tokens.npy missing\n", golden); return 2; }
    if (zaya_load(&m, argv[1], 0, err, sizeof err) != 0 || zaya_state_init(&s, &m, T, 1, err, sizeof err) != 0) {
        fprintf(stderr, "test_bf16_steps: %s\n", err);
        return 2;
    }
    const ZayaConfig *c = &m.config;
    const int H = c->hidden_size, d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, C = (nq + nkv) * d;
    const int QD = nq * d, KD = nkv * d, R = c->router_hidden, E1 = c->num_experts + 1, t1 = c->cca_time1;
    if (cols != H) { fprintf(stderr, "test_bf16_steps: the golden's hidden size %d is not the blob's %d\n", cols, H); return 2; }
    Activations *a = s.act;
    AttnCapture cap = {calloc((size_t)T * nq * T, sizeof(float)), nq, T};
    Batch b = {c, a, s.kernels, NULL, NULL, -1, 0, T, precision, placement, NULL, 0};

    int n_ids, one;   /* §3.1 */
    float *ids_f = read_npy_at("tokens", 1, &n_ids, &one);
    if (!ids_f || n_ids != T) { fprintf(stderr, "test_bf16_steps: %s/tokens.npy missing or not [%d]\n", golden, T); return 2; }
    int *ids = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) ids[t] = (int)ids_f[t];
    free(ids_f);
    embed(&b, &m, ids, NULL, a->e, a->r);
    compare_rows(-1, "embed_tokens (lookup)", EXACT, a->e, H, e_tap, H, T);
    float *r_in = malloc(sizeof(float) * T * H);
    memcpy(r_in, a->r, sizeof(float) * T * H);   /* layer 0's input: input scaling of the official embedding */
    float *rho_prev = NULL;

    for (int i = 0; i < c->num_layers; i++) {
        const ZayaLayer *L = &m.layers[i];
        ZayaLayerState *ls = &s.layers[i];
        b.layer = i;
        float *h1 = layer_tap(i, "input_layernorm", T, H), *qp = layer_tap(i, "self_attn.qkv_proj.q_proj", T, QD);
        float *kp = layer_tap(i, "self_attn.qkv_proj.k_proj", T, KD);
        float *dw = layer_tap(i, "self_attn.qkv_proj.conv_qk_depthwise", T + t1 - 1, C);
        float *gr = layer_tap(i, "self_attn.qkv_proj.conv_qk_grouped", T, C);
        float *qq = layer_tap(i, "self_attn.qkv_proj.query", T, QD), *kk = layer_tap(i, "self_attn.qkv_proj.key", T, KD);
        float *vc = layer_tap(i, "self_attn.qkv_proj.v_proj_current", T, KD / 2);
        float *vd = layer_tap(i, "self_attn.qkv_proj.v_proj_delayed", T, KD / 2);
        float *vv = layer_tap(i, "self_attn.qkv_proj.value", T, KD);
        float *qn = layer_tap(i, "self_attn.qk_norm.query", T, QD), *kn = layer_tap(i, "self_attn.qk_norm.key", T, KD);
        float *aw = layer_tap(i, "self_attn.attn_weights", T, nq * T), *ao = layer_tap(i, "self_attn.o_proj.input", T, QD);
        float *op = layer_tap(i, "self_attn.o_proj", T, H), *ps = layer_tap(i, "post_attention_residual_scale", T, H);
        float *h2 = layer_tap(i, "post_attention_layernorm", T, H), *dn = layer_tap(i, "mlp.gate.down_proj", T, R);
        float *rs = layer_tap(i, "mlp.gate.router_states", T, R), *rn = layer_tap(i, "mlp.gate.router_mlp.norm", T, R);
        float *f1 = layer_tap(i, "mlp.gate.router_mlp.fc1", T, R), *f2 = layer_tap(i, "mlp.gate.router_mlp.fc2", T, R);
        float *lg = layer_tap(i, "mlp.gate.router_mlp", T, E1), *pw = layer_tap(i, "mlp.gate.router_probs", T, 1);
        float *ix = layer_tap(i, "mlp.gate.router_indices", T, 1), *ex = layer_tap(i, "mlp.experts", T, H);
        float *pm = layer_tap(i, "post_mlp_residual_scale", T, H);

        residual_norm(&b, "", a->h, r_in, L->input_layernorm, H, c->rms_norm_eps);                      /* §3.2 */
        compare_rows(i, "input_layernorm (norm)", EXACT, a->h, H, h1, H, T);
        cca_projections(&b, L, h1, a->u);                                                          /* §3.3 */
        compare_rows(i, "q_proj (product)", PRODUCT, a->u, C, qp, QD, T);
        compare_rows(i, "k_proj (product)", PRODUCT, a->u + QD, C, kp, KD, T);
        for (int t = 0; t < T; t++) {   /* the official u */
            memcpy(a->u + (size_t)t * C, qp + (size_t)t * QD, sizeof(float) * QD);
            memcpy(a->u + (size_t)t * C + QD, kp + (size_t)t * KD, sizeof(float) * KD);
        }
        float *u = malloc(sizeof(float) * T * C);
        memcpy(u, a->u, sizeof(float) * T * C);
        cca_convolutions(&b, L, ls->conv_state, u, a->z);                                         /* §3.4 */
        compare_rows(i, "conv_qk_depthwise (product, t0 terms)", PRODUCT, a->conv_a, C, dw, C, T + t1 - 1);
        /* the grouped conv again, from the official depthwise outputs */
        conv_qk_grouped(&b, L, dw, a->z);
        compare_rows(i, "conv_qk_grouped (product)", PRODUCT, a->z, C, gr, C, T);
        residual_mix(&b, u, a->q_res, a->k_res);                                                  /* §3.5, 3.6 */
        qk_assembly(&b, gr, a->q_res, a->k_res, a->q, a->key);
        compare_rows(i, "residual mix + q/k assembly (elementwise)", EXACT, a->q, QD, qq, QD, T);
        compare_rows(i, "residual mix + q/k assembly: keys", EXACT, a->key, KD, kk, KD, T);
        float *dv = malloc(sizeof(float) * KD / 2);
        memcpy(dv, ls->delayed_value, sizeof(float) * KD / 2);
        values(&b, L, dv, h1, a->v, a->vd);                                                       /* §3.7 */
        compare_rows(i, "v_proj_current (product)", PRODUCT, a->v, KD, vc, KD / 2, T);
        compare_rows(i, "v_proj_delayed (product)", PRODUCT, a->vd, KD / 2, vd, KD / 2, T);
        compare_rows(i, "value (the delayed half: a copy)", PRODUCT, a->v, KD, vv, KD, T);
        memcpy(a->q, qq, sizeof(float) * T * QD);
        memcpy(a->key, kk, sizeof(float) * T * KD);
        qk_norm(&b, a->q, a->key, L->qk_norm_temp);                                               /* §3.8 */
        compare_rows(i, "qk_norm: queries (norm)", EXACT, a->q, QD, qn, QD, T);
        compare_rows(i, "qk_norm: keys (norm)", EXACT, a->key, KD, kn, KD, T);
        memcpy(a->q, qn, sizeof(float) * T * QD);
        memcpy(a->key, kn, sizeof(float) * T * KD);
        rope(&b, c->layer_types[i], a->q, a->key);                                               /* §3.9, 3.10 */
        memset(cap.probs, 0, sizeof(float) * (size_t)T * nq * T);
        Batch ba = b;
        ba.tap = capture_attn;
        ba.tap_ctx = &cap;
        memcpy(a->v, vv, sizeof(float) * T * KD);
        self_attention(&ba, c->layer_types[i], ls, a->q, a->key, a->v, a->attn_out);
        compare_rows(i, "RoPE + softmax(q.k) (elementwise, products)", PRODUCT, cap.probs, nq * T, aw, nq * T, T);
        compare_rows(i, "attention output p.v (product)", PRODUCT, a->attn_out, QD, ao, QD, T);
        linear(&b, "", a->branch, &L->o_proj, L->o_proj_bias, ao);                                /* §3.11 */
        compare_rows(i, "o_proj (product)", PRODUCT, a->branch, H, op, H, T);
        memcpy(a->r, r_in, sizeof(float) * T * H);
        residual_scaling(&b, "", a->r, op, &L->post_attention_residual_scale);                   /* §3.12 */
        compare_rows(i, "post_attention_residual_scale (elementwise)", EXACT, a->r, H, ps, H, T);
        residual_norm(&b, "", a->h, ps, L->post_attention_layernorm, H, c->rms_norm_eps);             /* §3.13 */
        compare_rows(i, "post_attention_layernorm (norm)", EXACT, a->h, H, h2, H, T);
        linear(&b, "", a->router_down, &L->router_down_proj, L->router_down_proj_bias, h2);     /* §3.14 */
        compare_rows(i, "router down_proj (product)", PRODUCT, a->router_down, R, dn, R, T);
        if (rho_prev) memcpy(a->router_state, rho_prev, sizeof(float) * T * R);
        eda(&b, L->router_states_scale, dn, a->router_state);
        compare_rows(i, "EDA (elementwise)", EXACT, a->router_state, R, rs, R, T);
        rmsnorm(&b, "", a->router_normed, rs, L->router_norm, R, c->router_norm_eps);
        compare_rows(i, "router_mlp.norm (norm)", EXACT, a->router_normed, R, rn, R, T);
        linear(&b, "", a->router_fc1, &L->router_fc1, L->router_fc1_bias, rn);
        compare_rows(i, "router fc1 (product)", PRODUCT, a->router_fc1, R, f1, R, T);
        memcpy(a->router_fc1, f1, sizeof(float) * T * R);
        gelu_held(&b, a->router_fc1, (size_t)T * R);
        linear(&b, "", a->router_fc2, &L->router_fc2, L->router_fc2_bias, a->router_fc1);
        compare_rows(i, "GELU + router fc2 (activation, product)", PRODUCT, a->router_fc2, R, f2, R, T);
        memcpy(a->router_fc2, f2, sizeof(float) * T * R);
        gelu_held(&b, a->router_fc2, (size_t)T * R);
        linear(&b, "", a->router_logits, &L->router_out_proj, NULL, a->router_fc2);
        compare_rows(i, "GELU + router out_proj (activation, product)", PRODUCT, a->router_logits, E1, lg, E1, T);
        route(&b, L->balancing_biases, lg, a->router_probs, a->router_scores, a->expert, a->expert_weight);
        float *chosen = malloc(sizeof(float) * T), *weight = malloc(sizeof(float) * T);
        for (int t = 0; t < T; t++) {   /* the official tap after the skip masking: class 0, weight 0 */
            const int skip = a->expert[t] == c->num_experts;
            chosen[t] = skip ? 0.0f : (float)a->expert[t];
            weight[t] = skip ? 0.0f : a->expert_weight[t];
        }
        compare_rows(i, "softmax + top-1: class (after the skip mask)", EXACT, chosen, 1, ix, 1, T);
        compare_rows(i, "softmax + top-1: weight (softmax)", EXACT, weight, 1, pw, 1, T);
        experts(&b, L, ZAYA_SKIP_ZERO, h2, a->expert, a->expert_weight, a->branch);             /* §3.15 */
        compare_rows(i, "experts (products, SiLU, weight)", PRODUCT, a->branch, H, ex, H, T);
        memcpy(a->r, ps, sizeof(float) * T * H);
        residual_scaling(&b, "", a->r, ex, &L->post_mlp_residual_scale);                         /* §3.16 */
        compare_rows(i, "post_mlp_residual_scale (elementwise)", EXACT, a->r, H, pm, H, T);
        memcpy(r_in, pm, sizeof(float) * T * H);
        free(rho_prev);
        rho_prev = rs;
        free(h1); free(qp); free(kp); free(dw); free(gr); free(qq); free(kk); free(vc); free(vd); free(vv); free(qn);
        free(kn); free(aw); free(ao); free(op); free(ps); free(h2); free(dn); free(rn); free(f1); free(f2); free(lg);
        free(pw); free(ix); free(ex); free(pm); free(u); free(dv); free(chosen); free(weight);
    }
    b.layer = -1;
    float *fn = need("model.norm", T, H);
    residual_norm(&b, "", a->h, r_in, m.norm, H, c->rms_norm_eps);                                    /* §3.17 */
    compare_rows(-1, "model.norm (norm)", EXACT, a->h, H, fn, H, T);
    int kr, k, kr2, k2;   /* §3.18: the official top-k logits of each position, at the official ids */
    float *top_ids = read_npy_at("logits_top16_ids", 1, &kr, &k), *top_values = read_npy_at("logits_top16_values", 1, &kr2, &k2);
    if (!top_ids || !top_values || kr != T || kr2 != T || k != k2) { fprintf(stderr, "test_bf16_steps: logits_top16 missing\n"); return 2; }
    float *ours = malloc(sizeof(float) * T * k);
    b.tap = capture_attn;   /* any tap: lm_head then computes every position's logits */
    b.tap_ctx = &cap;
    for (int t = 0; t < T; t++) {
        Batch one = b;
        one.pos = t;
        one.n = 1;
        lm_head(&one, &m, fn + (size_t)t * H, s.logits);
        for (int j = 0; j < k; j++) ours[t * k + j] = s.logits[(int)top_ids[t * k + j]];
    }
    compare_rows(-1, "lm_head: the official top-16 logits (product)", PRODUCT, ours, k, top_values, k, T);
    if (placement & ZAYA_BF16_FP32_LOGITS) {   /* the float32 logits round to the official bf16 ones */
        for (int j = 0; j < T * k; j++) ours[j] = zaya_round_bf16(ours[j]);
        compare_rows(-1, "lm_head: float32 logits, rounded (product)", PRODUCT, ours, k, top_values, k, T);
    }
    free(top_ids); free(top_values); free(ours);
    printf("%d checks of %d layers, %s: %d failed\n", checks, c->num_layers,
           zaya_precision_name(precision, placement, err, sizeof err), failures);
    free(fn); free(rho_prev); free(r_in); free(ids); free(e_tap); free(cap.probs);
    zaya_state_free(&s);
    zaya_free(&m);
    return failures ? 1 : 0;
}
