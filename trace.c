/* trace.c - `zaya --trace POS [--trace-layer N]`: one token through forward(), step by step.
 *
 * Every step is one line (wrapped only when its first values do not fit in 120 columns):
 *
 *   step (HF module path)              shape          |x|        min        max  first values
 *   self_attn.qkv_proj.q_proj          [512]      12.3456   -1.23456    2.34567   0.123457 ...
 *
 * The names are the --dump names: model-level ones as they are, layer ones without the prefix
 * "model.layers.N." that the layer's header line shows. Numbers are %.6g of the same float32 values
 * --dump writes. Indented lines below a step explain it with this token's numbers.
 */
#include "trace.h"
#include "kernels.h"
#include "tokenizer.h"
#include "zmath.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 120          /* no line is longer */
#define COL_SHAPE 35       /* column where the shape starts */
#define COL_NORM_END 53    /* right edges of the number columns */
#define COL_MIN_END 64
#define COL_MAX_END 75
#define VALUE_W 11         /* each first value: a space and 10 columns */
#define N_FIRST 4

/* ---- a line being built ---- */

typedef struct {
    char s[1024];
    int len;
} Line;

static void add(Line *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->s + l->len, sizeof l->s - (size_t)l->len, fmt, ap);
    va_end(ap);
    if (n > 0) l->len = l->len + n < (int)sizeof l->s ? l->len + n : (int)sizeof l->s - 1;
}

/* spaces up to column col (at least one space unless the line is empty) */
static void pad_to(Line *l, int col) {
    if (l->len > 0 && l->len >= col) add(l, " ");
    while (l->len < col && l->len < (int)sizeof l->s - 1) l->s[l->len++] = ' ';
    l->s[l->len] = 0;
}

/* a right-aligned field ending at column end */
static void add_right(Line *l, int end, const char *text) {
    pad_to(l, end - (int)strlen(text));
    add(l, "%s", text);
}

static void put(const ZayaTrace *t, Line *l) {
    fprintf(t->out, "%s\n", l->s);
    l->len = 0;
    l->s[0] = 0;
}

/* an explanation line under a step */
static void note(const ZayaTrace *t, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(t->out, "    %s\n", buf);
}

/* Appends `item` to a note line; starts a new line (indented to `indent`) when it would pass WIDTH. */
static void add_item(const ZayaTrace *t, Line *l, int indent, const char *item) {
    if (l->len + 1 + (int)strlen(item) > WIDTH) {
        put(t, l);
        pad_to(l, indent);
    }
    add(l, "%s%s", l->len > 0 && l->s[l->len - 1] != ' ' ? " " : "", item);
}

/* ---- token text: HF decode of one id, quoted, escaped for the terminal, at most ~20 bytes ---- */

static void token_text(const ZayaTrace *t, int id, char *out, size_t n) {
    const ZayaTokenizer *tok = t->m->tokenizer;
    size_t len = 0;
    char *text = tok ? zaya_tok_decode(tok, &id, 1, 0, &len) : NULL;
    if (!text || len == 0) {          /* no tokenizer, or an id without text: the piece or the id */
        size_t plen = 0;
        const char *piece = tok ? zaya_tok_piece(tok, id, &plen) : NULL;
        free(text);
        text = NULL;
        if (piece && plen) {
            text = malloc(plen + 1);
            if (text) { memcpy(text, piece, plen); text[plen] = 0; len = plen; }
        }
        if (!text) { snprintf(out, n, "#%d", id); return; }
    }
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < len && o + 8 < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (o > 22 && (ch & 0xC0) != 0x80) { memcpy(out + o, "...", 3); o += 3; break; }
        if (ch == '"' || ch == '\\') { out[o++] = '\\'; out[o++] = (char)ch; }
        else if (ch == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (ch == '\t') { out[o++] = '\\'; out[o++] = 't'; }
        else if (ch == '\r') { out[o++] = '\\'; out[o++] = 'r'; }
        else if (ch < 0x20 || ch == 0x7f) o += (size_t)snprintf(out + o, n - o, "\\x%02x", ch);
        else out[o++] = (char)ch;     /* UTF-8 bytes as they are: decode() gives valid UTF-8 */
    }
    out[o++] = '"';
    out[o] = 0;
    free(text);
}

/* ---- the step line ---- */

static size_t tap_count(const ZayaTap *tap) {
    return tap->ndim == 0 ? 1 : tap->ndim == 1 ? (size_t)tap->shape[0] : (size_t)tap->shape[0] * (size_t)tap->shape[1];
}

static double tap_value(const ZayaTap *tap, size_t i) {
    return tap->is_int ? (double)((const int32_t *)tap->data)[i] : (double)((const float *)tap->data)[i];
}

static void format_number(char *out, size_t n, const ZayaTap *tap, double v) {
    if (tap->is_int) snprintf(out, n, "%d", (int)v);
    else snprintf(out, n, "%.6g", v);
}

/* name, shape, L2 norm, min, max, the first N_FIRST values */
static void step_line(const ZayaTrace *t, const ZayaTap *tap) {
    const size_t count = tap_count(tap);
    double ss = 0.0, mn = INFINITY, mx = -INFINITY;
    for (size_t i = 0; i < count; i++) {
        double v = tap_value(tap, i);
        ss += v * v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    Line l = {{0}, 0};
    char num[64];
    add(&l, "%s", tap->name);
    pad_to(&l, COL_SHAPE);
    if (tap->ndim == 0) add(&l, "[]");
    else if (tap->ndim == 1) add(&l, "[%d]", tap->shape[0]);
    else add(&l, "[%d,%d]", tap->shape[0], tap->shape[1]);
    snprintf(num, sizeof num, "%.6g", sqrt(ss));
    add_right(&l, COL_NORM_END, num);
    format_number(num, sizeof num, tap, mn);
    add_right(&l, COL_MIN_END, num);
    format_number(num, sizeof num, tap, mx);
    add_right(&l, COL_MAX_END, num);
    int col = 0;                      /* value column on this line */
    for (size_t i = 0; i < count && i < N_FIRST; i++, col++) {
        format_number(num, sizeof num, tap, tap_value(tap, i));
        const int len = (int)strlen(num);
        int end = COL_MAX_END + (col + 1) * VALUE_W;
        if (end < l.len + 1 + len) end = l.len + 1 + len;   /* pushed right by a long number */
        if (end > WIDTH) {            /* wrap: the rest continues below, in the value columns */
            put(t, &l);
            col = 0;
            end = COL_MAX_END + VALUE_W;
        }
        add_right(&l, end, num);
    }
    put(t, &l);
}

/* ---- the explanations ---- */

static void layer_header(ZayaTrace *t, int layer) {
    const ZayaConfig *c = &t->m->config;
    const int type = c->layer_types[layer];
    if (t->layer >= 0 && layer > 0 && t->cur_layer < 0)
        fprintf(t->out, "(layers 0..%d not shown: --trace-layer %d)\n", layer - 1, t->layer);
    t->cur_layer = layer;
    if (type == ZAYA_HYBRID_SLIDING) {
        int first = t->pos - c->sliding_window + 1 > 0 ? t->pos - c->sliding_window + 1 : 0;
        fprintf(t->out, "== model.layers.%d: hybrid_sliding (window %d: keys %d..%d), RoPE theta %g on %d of %d dims ==\n",
                layer, c->sliding_window, first, t->pos, (double)c->rope_theta[type], c->rope_dim[type], c->head_dim);
    } else {
        fprintf(t->out, "== model.layers.%d: hybrid (full causal: keys 0..%d), RoPE theta %g on %d of %d dims ==\n",
                layer, t->pos, (double)c->rope_theta[type], c->rope_dim[type], c->head_dim);
    }
}

/* "u[t-1] = pos 29" or "u[t-1] = zero pad" for the k-th input of a causal conv of kernel `kernel` */
static void window_item(char *out, size_t n, const char *sym, int pos, int back) {
    if (back) snprintf(out, n, "%s[t-%d] = ", sym, back);
    else snprintf(out, n, "%s[t] = ", sym);
    size_t len = strlen(out);
    if (pos - back >= 0) snprintf(out + len, n - len, "pos %d", pos - back);
    else if (!strcmp(sym, "u")) snprintf(out + len, n - len, "zero pad");
    else snprintf(out + len, n - len, "bias only");
}

static void explain_conv(const ZayaTrace *t, int grouped) {
    const ZayaConfig *c = &t->m->config;
    const int t0 = c->cca_time0, t1 = c->cca_time1, K = (t0 - 1) + (t1 - 1), p = t->pos;
    const int kernel = grouped ? t1 : t0;
    Line l = {{0}, 0};
    char item[64];
    pad_to(&l, 4);
    add(&l, "window");
    for (int back = kernel - 1; back >= 0; back--) {
        window_item(item, sizeof item, grouped ? "a" : "u", p, back);
        add_item(t, &l, 10, item);
        if (back) add(&l, ",");
    }
    if (grouped) {
        add(&l, "  (kernel %d, one %dx%d block per head)", t1, c->head_dim, c->head_dim);
        put(t, &l);
        if (p - K < 0) note(t, "so z_t reads u at pos %d..%d, the %d before pos 0 zero-padded (a of a padded step = b0, not 0)",
                            p - K, p, K - p);
        else note(t, "so z_t reads u at pos %d..%d: the conv state (%d raw columns) and this token's u", p - K, p, K);
        if (K > 0) {
            int oldest = p - K + 1;
            if (oldest >= 0) note(t, "conv state after this token: u at pos %d..%d (oldest first)", oldest, p);
            else note(t, "conv state after this token: u at pos %d..%d, %d zero column(s) before them", 0, p, -oldest);
        }
    } else {
        add(&l, "  (kernel %d, one weight per channel; a_t shown)", t0);
        put(t, &l);
    }
}

static void explain_value(const ZayaTrace *t) {
    const ZayaConfig *c = &t->m->config;
    const int half = c->num_kv_heads / 2, vhalf = c->num_kv_heads * c->head_dim / 2;
    char cur[48], del[48];
    if (c->num_kv_heads % 2)   /* odd: the middle head straddles the two halves (architecture.md 3.7) */
        snprintf(cur, sizeof cur, "channels 0..%d", vhalf - 1), snprintf(del, sizeof del, "channels %d..%d", vhalf, 2 * vhalf - 1);
    else if (half == 1) snprintf(cur, sizeof cur, "KV head 0");
    else snprintf(cur, sizeof cur, "KV heads 0..%d", half - 1);
    if (c->num_kv_heads % 2 == 0 && c->num_kv_heads - half == 1) snprintf(del, sizeof del, "head %d", half);
    else if (c->num_kv_heads % 2 == 0) snprintf(del, sizeof del, "heads %d..%d", half, c->num_kv_heads - 1);
    if (t->pos > 0)
        note(t, "%s = v_proj_current(h at pos %d); %s = v_proj_delayed(h at pos %d), kept from the previous token",
             cur, t->pos, del, t->pos - 1);
    else note(t, "%s = v_proj_current(h at pos 0); %s = v_proj_delayed(0) = %s (no previous token)", cur, del,
              c->attention_bias ? "its bias" : "0");
    note(t, "delayed-value state after this token: v_proj_delayed(h at pos %d) (the line above)", t->pos);
}

static void explain_qk_norm(const ZayaTrace *t, const ZayaTap *tap, int is_key) {
    const ZayaConfig *c = &t->m->config;
    const int heads = tap->shape[0], d = tap->shape[1];
    const float *x = tap->data;
    const float *temp = t->m->layers[tap->layer].qk_norm_temp;
    Line l = {{0}, 0};
    char item[48];
    pad_to(&l, 4);
    add(&l, "head norms:");
    for (int n = 0; n < heads; n++) {
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)x[n * d + i] * x[n * d + i];
        snprintf(item, sizeof item, "%.6g", sqrt(ss));
        add_item(t, &l, 15, item);
    }
    if (is_key) {
        add_item(t, &l, 15, "= sqrt(d) * temp, temp:");
        for (int j = 0; j < c->num_kv_heads; j++) {
            snprintf(item, sizeof item, "%.4g", (double)temp[j]);
            add_item(t, &l, 15, item);
        }
    } else {
        snprintf(item, sizeof item, "= sqrt(d) = %.6g", sqrt((double)d));
        add_item(t, &l, 15, item);
    }
    put(t, &l);
}

static void explain_rope(const ZayaTrace *t, int layer) {
    const ZayaConfig *c = &t->m->config;
    const int type = c->layer_types[layer], rot = c->rope_dim[type];
    if (rot < 2) { note(t, "no rotary dims on this layer type (partial_rotary_factor %g)", (double)c->partial_rotary_factor[type]); return; }
    const float first = (float)t->pos, last = (float)t->pos / zaya_powf(c->rope_theta[type], (float)(rot - 2) / (float)rot);
    note(t, "dims [0,%d) of every head rotated in pairs (j, j+%d) by pos * theta^(-2j/%d): %.6g rad (j=0) .. %.4g rad (j=%d)",
         rot, rot / 2, rot, (double)first, (double)last, rot / 2 - 1);
    if (rot < c->head_dim) note(t, "dims [%d,%d) unchanged", rot, c->head_dim);
}

static void explain_key_cache(const ZayaTrace *t, int layer) {
    const ZayaConfig *c = &t->m->config;
    if (c->layer_types[layer] == ZAYA_HYBRID_SLIDING)
        note(t, "-> key cache: a ring of the last %d positions, slot %d %% %d = %d (values likewise)",
             c->sliding_window, t->pos, c->sliding_window, t->pos % c->sliding_window);
    else note(t, "-> key cache row %d (values likewise)", t->pos);
}

/* ZAYA1-VL: the image position's keys (zaya.c §V.10): the keys first..pos its causal (or sliding) mask allows and
 * every image position of the prompt, in position order, into kpos[]. Returns their count. */
static int image_keys(const ZayaTrace *t, int first, int *kpos, int cap) {
    int n = 0;
    for (int k = 0; k < t->n_tokens && n < cap; k++)
        if ((k >= first && k <= t->pos) || t->image[k]) kpos[n++] = k;
    return n;
}

static void explain_attention(const ZayaTrace *t, const ZayaTap *tap) {
    const ZayaConfig *c = &t->m->config;
    const int nq = tap->shape[0], n_keys = tap->shape[1], first = t->pos - n_keys + 1, g = nq / c->num_kv_heads;
    const float *p = tap->data;
    const int sliding = c->layer_types[tap->layer] == ZAYA_HYBRID_SLIDING;
    int *kpos = t->image && t->image[t->pos] ? malloc(sizeof(int) * (size_t)n_keys) : NULL;
    if (kpos) {   /* ZAYA1-VL: an image position of the prompt attends to every image position too */
        const int from = sliding && t->pos - c->sliding_window + 1 > 0 ? t->pos - c->sliding_window + 1 : 0;
        int after = 0, before = 0;
        for (int k = 0; k < t->n_tokens; k++) after += t->image[k] && k > t->pos, before += t->image[k] && k < from;
        if (image_keys(t, from, kpos, n_keys) != n_keys) { free(kpos); kpos = NULL; }
        else {
            note(t, "keys: %s [%d, %d] and every image position: the bidirectional image mask (arch §V.10)",
                 sliding ? "the window" : "every position", from, t->pos);
            note(t, "  adds the %d image positions after this one%s", after,
                 before ? " and the earlier ones outside the window" : "");
        }
    }
    if (!kpos && sliding)
        note(t, "keys: window [%d, %d] (this token and the %d before it%s)", first, t->pos, n_keys - 1,
             first > 0 ? "; earlier ones are masked" : "; the window is not full yet");
    else if (!kpos) note(t, "keys: every position [0, %d] (full causal attention)", t->pos);
    for (int n = 0; n < nq; n++) {
        Line l = {{0}, 0};
        char item[96], text[48];
        pad_to(&l, 4);
        add(&l, "head %d (KV %d) top:", n, n / g);
        int used[3] = {-1, -1, -1};
        for (int r = 0; r < 3 && r < n_keys; r++) {       /* the 3 largest, ties: the earlier position */
            int best = -1;
            for (int j = 0; j < n_keys; j++) {
                if (j == used[0] || j == used[1]) continue;
                if (best < 0 || p[n * n_keys + j] > p[n * n_keys + best]) best = j;
            }
            used[r] = best;
            int kpos_r = kpos ? kpos[best] : first + best;
            if (kpos_r < t->n_tokens) token_text(t, t->tokens[kpos_r], text, sizeof text);
            else snprintf(text, sizeof text, "?");
            snprintf(item, sizeof item, "  pos %d %s %.4f", kpos_r, text, (double)p[n * n_keys + best]);
            add_item(t, &l, 22, item);
        }
        put(t, &l);
    }
    free(kpos);
}

/* ZAYA1-VL: |B (A x)|, the vision LoRA pair's addition for this token's input x (matmul_ref: the plain loops). */
static double lora_norm(const ZayaMatrix *A, const ZayaMatrix *B, const float *x) {
    float *mid = malloc(sizeof(float) * (size_t)A->rows + 1), *out = malloc(sizeof(float) * (size_t)B->rows + 1);
    double ss = 0.0;
    if (mid && out) {
        matmul_ref(mid, A->rows, A, x, A->cols, 1);
        matmul_ref(out, B->rows, B, mid, B->cols, 1);
        for (int i = 0; i < B->rows; i++) ss += (double)out[i] * out[i];
    }
    free(mid), free(out);
    return sqrt(ss);
}

/* ZAYA1-VL: what the vision LoRA adds after a step at an image position (arch §V.9), with its size. */
static void explain_lora(const ZayaTrace *t, const ZayaTap *tap) {
    const ZayaLayer *L = &t->m->layers[tap->layer];
    const char *n = tap->name;
    const size_t bytes = sizeof(float) * (size_t)(tap->ndim == 2 ? tap->shape[0] * tap->shape[1] : tap->shape[0]);
    if (!strcmp(n, "input_layernorm")) memcpy(t->h, tap->data, bytes);
    else if (!strcmp(n, "post_attention_layernorm")) memcpy(t->h2, tap->data, bytes);
    else if (!strcmp(n, "self_attn:attn_output")) memcpy(t->attn, tap->data, bytes);
    else if (!strcmp(n, "self_attn.qkv_proj.k_proj")) {
        note(t, "+ vision LoRA (an image position, rank %d): q~ += q_lora_b(q_lora_a h), |%.6g|;", L->q_lora_a.rows,
             lora_norm(&L->q_lora_a, &L->q_lora_b, t->h));
        note(t, "  k~ += k_lora_b(k_lora_a h), |%.6g|. The lines above are the projections alone;",
             lora_norm(&L->k_lora_a, &L->k_lora_b, t->h));
        note(t, "  u = [q~ ; k~] with the LoRA feeds the convolutions and the residual mix below");
    } else if (!strcmp(n, "self_attn.qkv_proj.v_proj_delayed")) {
        note(t, "+ vision LoRA (an image position): v_current += v_current_lora_b(v_current_lora_a h), |%.6g|;",
             lora_norm(&L->v_current_lora_a, &L->v_current_lora_b, t->h));
        note(t, "  v_delayed += v_delayed_lora_b(v_delayed_lora_a h), |%.6g| (the lines above: the projections alone)",
             lora_norm(&L->v_delayed_lora_a, &L->v_delayed_lora_b, t->h));
    } else if (!strcmp(n, "self_attn.o_proj")) {
        note(t, "+ vision LoRA (an image position): o_lora_b(o_lora_a attn_output), |%.6g|, is added to this line",
             lora_norm(&L->o_lora_a, &L->o_lora_b, t->attn));
        note(t, "  before the residual scaling");
    } else if (!strcmp(n, "mlp.experts") && t->chosen < t->m->config.num_experts) {
        const int E = t->m->config.num_experts, r = L->experts_lora_gate_up_a.rows / E;
        const int I2 = L->experts_lora_gate_up_b.rows / E;
        const ZayaMatrix A = matrix_rows(&L->experts_lora_gate_up_a, t->chosen * r, r);
        const ZayaMatrix B = matrix_rows(&L->experts_lora_gate_up_b, t->chosen * I2, I2);
        note(t, "vision LoRA (an image position) inside expert %d: gate|up += |%.6g| (lora_gate_up_proj, rank %d),",
             t->chosen, lora_norm(&A, &B, t->h2), r);
        note(t, "  and lora_down_proj's pair on SiLU(gate) * up is added to its down_proj");
    }
}

static void explain_router_state(const ZayaTrace *t, int layer) {
    if (!t->m->layers[layer].router_states_scale)
        note(t, "layer %d: rho = down_proj (no EDA here); rho is handed on to layer %d", layer, layer + 1);
    else note(t, "EDA: rho = down_proj + router_states_scale * rho of layer %d; handed on to layer %d", layer - 1, layer + 1);
}

/* The router's E+1 classes in rows of up to 9, then the choice. */
static void explain_router(ZayaTrace *t, int layer, int chosen) {
    const ZayaConfig *c = &t->m->config;
    const int E = c->num_experts;
    const float *bias = t->m->layers[layer].balancing_biases;
    for (int e0 = 0; e0 <= E; e0 += 9) {
        const int e1 = e0 + 9 <= E + 1 ? e0 + 9 : E + 1;
        const char *labels[] = {"class", "prob", "+ bias", "= score"};
        for (int row = 0; row < 4; row++) {
            Line l = {{0}, 0};
            char num[32];
            pad_to(&l, 4);
            add(&l, "%s", labels[row]);
            for (int e = e0; e < e1; e++) {
                if (row == 0 && e == E) snprintf(num, sizeof num, "skip(%d)", E);
                else if (row == 0) snprintf(num, sizeof num, "%d", e);
                else snprintf(num, sizeof num, "%.6g", (double)(row == 1 ? t->probs[e] : row == 2 ? bias[e] : t->scores[e]));
                add_right(&l, 12 + (e - e0 + 1) * 12, num);
            }
            put(t, &l);
        }
    }
    int second = -1;
    for (int e = 0; e <= E; e++)
        if (e != chosen && (second < 0 || t->scores[e] > t->scores[second])) second = e;
    char runner[32];
    if (second == E) snprintf(runner, sizeof runner, "skip");
    else snprintf(runner, sizeof runner, "class %d", second);
    if (chosen == E)
        note(t, "choice: class %d = the SKIP expert, score margin %.6g over %s; P[skip] = %.6g", chosen,
             second >= 0 ? (double)(t->scores[chosen] - t->scores[second]) : 0.0, runner, (double)t->probs[chosen]);
    else
        note(t, "choice: expert %d, score margin %.6g over %s; weight = its unbiased P = %.6g", chosen,
             second >= 0 ? (double)(t->scores[chosen] - t->scores[second]) : 0.0, runner, (double)t->probs[chosen]);
}

static void explain_experts(const ZayaTrace *t) {
    const ZayaConfig *c = &t->m->config;
    const int E = c->num_experts, I = c->moe_intermediate;
    if (t->chosen < E)
        note(t, "y = %.6g * down_proj[%d](SiLU(gate) * up), gate|up = gate_up_proj[%d] h2 (rows 0..%d | %d..%d)",
             (double)t->weight, t->chosen, t->chosen, I - 1, I, 2 * I - 1);
    else if (t->skip_expert == ZAYA_SKIP_PASSTHROUGH)
        note(t, "skip expert, --skip-expert passthrough (Zyphra fork): y = P[skip] * h2 = %.6g * h2", (double)t->weight);
    else note(t, "skip expert (upstream): y = 0, no expert weights are read; the layer adds only the residual scaling");
}

static void explain_logits(const ZayaTrace *t, const ZayaTap *tap) {
    const float *x = tap->data;
    const int V = tap->shape[0];
    int top[5];
    int k = 0;
    for (; k < 5 && k < V; k++) {            /* the 5 largest, ties: the lower id */
        int best = -1;
        for (int v = 0; v < V; v++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= top[j] == v;
            if (!taken && (best < 0 || x[v] > x[best])) best = v;
        }
        top[k] = best;
    }
    char text[48];
    for (int j = 0; j < k; j++) {
        token_text(t, top[j], text, sizeof text);
        note(t, "top %d: id %6d  logit %10.6g  %s", j + 1, top[j], (double)x[top[j]], text);
    }
}

/* ---- the tap consumer ---- */

void zaya_trace_tap(void *ctx, const ZayaTap *tap) {
    ZayaTrace *t = ctx;
    if (tap->pos != t->pos) return;                       /* another position of the batch */
    if (!strcmp(tap->name, "model.norm") && t->layer >= 0 && t->layer < t->m->config.num_layers - 1)
        fprintf(t->out, "(layers %d..%d not shown)\n", t->layer + 1, t->m->config.num_layers - 1);
    if (tap->layer >= 0) {
        if (t->layer >= 0 && tap->layer != t->layer) return;
        if (tap->layer != t->cur_layer) layer_header(t, tap->layer);
    }
    const char *n = tap->name;
    /* remember what the router's choice line needs */
    const int E = t->m->config.num_experts;
    if (!strcmp(n, "mlp.gate:router_probs")) memcpy(t->probs, tap->data, sizeof(float) * (size_t)(E + 1));
    if (!strcmp(n, "mlp.gate:router_scores")) memcpy(t->scores, tap->data, sizeof(float) * (size_t)(E + 1));
    if (!strcmp(n, "mlp.gate.router_indices")) t->chosen = *(const int32_t *)tap->data;
    if (!strcmp(n, "mlp.gate:router_weight")) t->weight = *(const float *)tap->data;

    step_line(t, tap);

    if (!strcmp(n, "self_attn.qkv_proj.conv_qk_depthwise")) explain_conv(t, 0);
    else if (!strcmp(n, "self_attn.qkv_proj.conv_qk_grouped")) explain_conv(t, 1);
    else if (!strcmp(n, "self_attn.qkv_proj:value")) explain_value(t);
    else if (!strcmp(n, "self_attn.qk_norm:query")) explain_qk_norm(t, tap, 0);
    else if (!strcmp(n, "self_attn.qk_norm:key")) explain_qk_norm(t, tap, 1);
    else if (!strcmp(n, "self_attn:query_after_rope")) explain_rope(t, tap->layer);
    else if (!strcmp(n, "self_attn:key_after_rope")) explain_key_cache(t, tap->layer);
    else if (!strcmp(n, "self_attn:attn_weights")) explain_attention(t, tap);
    else if (!strcmp(n, "mlp.gate:router_state")) explain_router_state(t, tap->layer);
    else if (!strcmp(n, "mlp.gate.router_indices")) explain_router(t, tap->layer, t->chosen);
    else if (!strcmp(n, "mlp.experts")) explain_experts(t);
    else if (!strcmp(n, "logits")) explain_logits(t, tap);
    if (t->image && t->image[t->pos] && tap->layer >= 0) explain_lora(t, tap);
    if (t->image && t->image[t->pos] && !strcmp(n, "model.embed_tokens")) {
        int k = 0, n_image = 0, a = -1, b = -1;
        for (int p = 0; p < t->n_tokens; p++)
            if (t->image[p]) k += p < t->pos, n_image++, a = a < 0 ? p : a, b = p;
        note(t, "ZAYA1-VL: image position %d of %d (positions %d..%d): this placeholder row is replaced by the", k,
             n_image, a, b);
        note(t, "  image feature %d (model.visual row %d, HF masked_scatter) before the input scaling below", k, k);
    }
}

int zaya_trace_set_images(ZayaTrace *t, const unsigned char *image, char *err, size_t errlen) {
    const int H = t->m->config.hidden_size;
    t->image = image;
    t->h = calloc((size_t)H, sizeof(float));
    t->h2 = calloc((size_t)H, sizeof(float));
    t->attn = calloc((size_t)t->m->config.num_heads * t->m->config.head_dim, sizeof(float));
    if (!t->h || !t->h2 || !t->attn) return zaya_fail(err, errlen, "out of memory for --trace");
    return 0;
}

int zaya_trace_init(ZayaTrace *t, const ZayaModel *m, int pos, int layer, const int *tokens, int n_tokens,
                    int skip_expert, FILE *out, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    memset(t, 0, sizeof *t);
    if (pos < 0 || pos >= n_tokens) {
        snprintf(err, errlen, "--trace %d is not a position of the prompt\n  expected: 0..%d (the prompt has %d tokens)",
                 pos, n_tokens - 1, n_tokens);
        return -1;
    }
    if (layer >= c->num_layers) {
        snprintf(err, errlen, "--trace-layer %d is not a layer of this model\n  expected: 0..%d", layer, c->num_layers - 1);
        return -1;
    }
    t->m = m;
    t->out = out;
    t->pos = pos;
    t->layer = layer;
    t->tokens = tokens;
    t->n_tokens = n_tokens;
    t->skip_expert = skip_expert;
    t->cur_layer = -1;
    t->probs = calloc((size_t)c->num_experts + 1, sizeof(float));
    t->scores = calloc((size_t)c->num_experts + 1, sizeof(float));
    if (!t->probs || !t->scores) {
        zaya_trace_free(t);
        snprintf(err, errlen, "out of memory for --trace");
        return -1;
    }
    char text[48];
    token_text(t, tokens[pos], text, sizeof text);
    fprintf(out, "# zaya --trace %d: token %d %s at position %d of a %d-token prompt; %s\n", pos, tokens[pos], text, pos,
            n_tokens, layer >= 0 ? "one layer (--trace-layer), model-level steps kept" : "every layer");
    fprintf(out, "# model: %d layers, hidden %d, %d query / %d KV heads of %d, CCA kernels %d+%d, %d experts + skip (%s)\n",
            c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim, c->cca_time0, c->cca_time1,
            c->num_experts, skip_expert == ZAYA_SKIP_PASSTHROUGH ? "passthrough" : "zero");
    Line l = {{0}, 0};
    add(&l, "# step (--dump name)");
    pad_to(&l, COL_SHAPE);
    add(&l, "shape");
    add_right(&l, COL_NORM_END, "|x|");
    add_right(&l, COL_MIN_END, "min");
    add_right(&l, COL_MAX_END, "max");
    add(&l, "  first values");
    put(t, &l);
    return 0;
}

void zaya_trace_free(ZayaTrace *t) {
    free(t->probs);
    free(t->scores);
    free(t->h);
    free(t->h2);
    free(t->attn);
    t->probs = t->scores = t->h = t->h2 = t->attn = NULL;
}
