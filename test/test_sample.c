/* test_sample.c - the sampler of the command line against the plain version it replaced.
 *
 *   make build/test_sample && build/test_sample
 *
 * main.c's sample() sorts the top-p candidates with a radix sort (sort_prob_desc). This test includes
 * main.c whole (its main renamed) to reach those static functions, and checks:
 *   - sort_prob_desc gives exactly the order of qsort with "probability descending, then id
 *     ascending", on arrays with many equal probabilities, for sizes 0, 1 and up;
 *   - sample() picks the same id as the qsort version (kept below as the reference) for random
 *     logits of peaked and flat shapes, several temperatures, top-p values and seeds.
 * Prints PASS/FAIL lines.
 */
#define main zaya_cli_main
#include "../main.c"
#undef main

static int failures = 0;

static void check(int ok, const char *what, const char *detail) {
    if (ok) printf("PASS %s\n", what);
    else { printf("FAIL %s: %s\n", what, detail); failures++; }
}

static int cmp_prob_desc(const void *a, const void *b) {
    const ProbIndex *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : (x->id > y->id) - (x->id < y->id);
}

/* sample() as it was before the radix sort: qsort, otherwise the same steps */
static int sample_qsort(float *logits, int n, float temperature, float topp, uint64_t *rng, ProbIndex *scratch) {
    if (temperature == 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++) logits[i] /= temperature;
    softmax(logits, n);
    float r = random_f32(rng);
    if (topp <= 0.0f || topp >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) { cdf += logits[i]; if (r < cdf) return i; }
        return n - 1;
    }
    int m = 0;
    const float cutoff = (1.0f - topp) / (float)(n - 1);
    for (int i = 0; i < n; i++) if (logits[i] >= cutoff) scratch[m++] = (ProbIndex){logits[i], i};
    qsort(scratch, (size_t)m, sizeof *scratch, cmp_prob_desc);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) { cum += scratch[i].p; if (cum > topp) { last = i; break; } }
    r *= cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) { cdf += scratch[i].p; if (r < cdf) return scratch[i].id; }
    return scratch[last].id;
}

int main(void) {
    uint64_t rng = 42;
    char what[160], detail[160];

    /* the sort: probabilities from a few distinct values (many ties) or spread out */
    const int sizes[] = {0, 1, 2, 7, 256, 1000, 70000};
    for (int k = 0; k < 7; k++)
        for (int distinct = 3; distinct <= 1 << 20; distinct *= 64) {
            const int m = sizes[k];
            ProbIndex *a = malloc(sizeof *a * (size_t)(m + 1)), *tmp = malloc(sizeof *a * (size_t)(m + 1));
            ProbIndex *want = malloc(sizeof *a * (size_t)(m + 1));
            for (int i = 0; i < m; i++)
                a[i] = (ProbIndex){(float)(1 + random_u32(&rng) % (uint32_t)distinct) / (float)distinct * 1e-3f, i};
            memcpy(want, a, sizeof *a * (size_t)m);
            qsort(want, (size_t)m, sizeof *want, cmp_prob_desc);
            sort_prob_desc(a, tmp, m);
            int bad = -1;
            for (int i = 0; i < m && bad < 0; i++) if (a[i].p != want[i].p || a[i].id != want[i].id) bad = i;
            snprintf(what, sizeof what, "sort_prob_desc = qsort order, %d entries from %d values", m, distinct);
            snprintf(detail, sizeof detail, "entry %d: id %d (p %g), expected id %d (p %g)", bad,
                     bad >= 0 ? a[bad].id : 0, bad >= 0 ? a[bad].p : 0, bad >= 0 ? want[bad].id : 0, bad >= 0 ? want[bad].p : 0);
            check(bad < 0, what, detail);
            free(a); free(tmp); free(want);
        }

    /* sample(): the same id as the qsort version, draw after draw */
    const int n = 262144;
    float *logits = malloc(sizeof *logits * n), *l1 = malloc(sizeof *l1 * n), *l2 = malloc(sizeof *l2 * n);
    ProbIndex *scratch = malloc(sizeof *scratch * 2 * (size_t)n);
    const float temps[] = {0.0f, 0.3f, 1.0f, 1.5f}, topps[] = {0.5f, 0.9f, 0.99f, 1.0f};
    for (int shape = 0; shape < 3; shape++) {          /* flat, peaked (LM-like), coarse (ties) */
        for (int i = 0; i < n; i++) {
            float u = random_f32(&rng);
            logits[i] = shape == 0 ? u : shape == 1 ? 12.0f * u * u * u * u - 0.00002f * (float)i : (float)(int)(u * 4.0f);
        }
        for (int ti = 0; ti < 4; ti++)
            for (int pi = 0; pi < 4; pi++) {
                int mismatches = 0, first = -1;
                uint64_t s1 = 7 + (uint64_t)shape, s2 = s1;
                for (int draw = 0; draw < 8; draw++) {
                    memcpy(l1, logits, sizeof *l1 * n);
                    memcpy(l2, logits, sizeof *l2 * n);
                    int a = sample(l1, n, temps[ti], topps[pi], &s1, scratch);
                    int b = sample_qsort(l2, n, temps[ti], topps[pi], &s2, scratch);
                    if (a != b && !mismatches++) first = draw;
                }
                snprintf(what, sizeof what, "sample = qsort version, shape %d, temperature %.1f, top-p %.2f, 8 draws",
                         shape, temps[ti], topps[pi]);
                snprintf(detail, sizeof detail, "%d draws differ, the first at draw %d", mismatches, first);
                check(mismatches == 0, what, detail);
            }
    }
    free(logits); free(l1); free(l2); free(scratch);
    return failures ? 1 : 0;
}
