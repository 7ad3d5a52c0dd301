/*
 * Unicode NFC for the NFC normalizer (Qwen2): canonical decomposition,
 * canonical ordering, canonical composition (UAX #15), with Hangul done by
 * arithmetic and the rest from the generated tables of tokenizer_unicode.c.
 * A quick scan leaves text that cannot change untouched, which is nearly all
 * text, so the full algorithm only runs where a combining mark, a
 * decomposable-only character or a composing jamo appears.
 */
#include "internal.h"

#include "infergate/error.h"

#include <stdlib.h>
#include <string.h>

#define RAW_BYTE 0x80000000u /* an invalid UTF-8 byte carried through as is */

#define S_BASE 0xAC00u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

static uint32_t ccc_of(uint32_t cp)
{
    size_t lo = 0, hi = ig__n_ccc_runs;
    if (cp < 0x300 || (cp & RAW_BYTE))
        return 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ig__ccc_runs[mid].lo)
            hi = mid;
        else if (cp > ig__ccc_runs[mid].hi)
            lo = mid + 1;
        else
            return ig__ccc_runs[mid].ccc;
    }
    return 0;
}

static const ig__decomp_t *decomp_of(uint32_t cp)
{
    size_t lo = 0, hi = ig__n_decomps;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ig__decomps[mid].cp)
            hi = mid;
        else if (cp > ig__decomps[mid].cp)
            lo = mid + 1;
        else
            return &ig__decomps[mid];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    size_t lo = 0, hi = ig__n_comps;
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
        b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ig__comp_t *c = &ig__comps[mid];
        if (a < c->first || (a == c->first && b < c->second))
            hi = mid;
        else if (a > c->first || b > c->second)
            lo = mid + 1;
        else
            return c->composite;
    }
    return 0;
}

int ig__nfc_needed(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l;
        if (s[i] < 0xCC) { /* below U+0300 nothing can change */
            i++;
            continue;
        }
        l = ig__utf8_decode(s + i, n - i, &cp);
        if (!l) {
            i++;
            continue;
        }
        if (ig__uni_in_ranges(ig__nfc_unsafe, ig__n_nfc_unsafe, cp))
            return 1;
        i += l;
    }
    return 0;
}

static int push_cp(uint32_t **v, size_t *n, size_t *cap, uint32_t cp)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        uint32_t *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return IG_ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = cp;
    return 0;
}

int ig__nfc(const unsigned char *s, size_t n, char **buf, size_t *cap, size_t *outlen)
{
    uint32_t *v = NULL;
    size_t nv = 0, capv = 0, i = 0, o = 0, out_n;
    int rc = 0;

    /* 1. Full canonical decomposition. */
    while (i < n && rc == 0) {
        uint32_t cp;
        size_t l = ig__utf8_decode(s + i, n - i, &cp);
        const ig__decomp_t *d;
        if (!l) {
            rc = push_cp(&v, &nv, &capv, RAW_BYTE | s[i]);
            i++;
            continue;
        }
        i += l;
        if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
            uint32_t si = cp - S_BASE;
            rc = push_cp(&v, &nv, &capv, L_BASE + si / N_COUNT);
            if (rc == 0)
                rc = push_cp(&v, &nv, &capv, V_BASE + (si % N_COUNT) / T_COUNT);
            if (rc == 0 && si % T_COUNT)
                rc = push_cp(&v, &nv, &capv, T_BASE + si % T_COUNT);
        } else if (cp >= 0xC0 && (d = decomp_of(cp)) != NULL) {
            for (uint32_t k = 0; k < d->len && rc == 0; k++)
                rc = push_cp(&v, &nv, &capv, ig__decomp_cps[d->off + k]);
        } else {
            rc = push_cp(&v, &nv, &capv, cp);
        }
    }
    if (rc != 0)
        goto done;

    /* 2. Canonical ordering: a stable sort of each run of non-starters. */
    for (size_t k = 1; k < nv; k++) {
        uint32_t c = v[k], cc = ccc_of(c);
        size_t j = k;
        if (cc == 0)
            continue;
        while (j > 0 && ccc_of(v[j - 1]) > cc) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = c;
    }

    /* 3. Canonical composition, in place. */
    out_n = 0;
    {
        size_t starter = SIZE_MAX;
        uint32_t last_cc = 0;
        for (size_t k = 0; k < nv; k++) {
            uint32_t c = v[k], cc = ccc_of(c), comp;
            int adjacent = starter != SIZE_MAX && out_n == starter + 1;
            if (starter != SIZE_MAX && !(c & RAW_BYTE) && (adjacent || (last_cc && last_cc < cc)) &&
                (comp = compose(v[starter], c)) != 0) {
                v[starter] = comp;
                continue;
            }
            if (cc == 0)
                starter = (c & RAW_BYTE) ? SIZE_MAX : out_n;
            last_cc = cc;
            v[out_n++] = c;
        }
    }

    /* 4. Back to UTF-8. */
    if (*cap < out_n * 4 + 1) {
        char *nb = realloc(*buf, out_n * 4 + 1);
        if (!nb) {
            rc = IG_ENOMEM;
            goto done;
        }
        *buf = nb;
        *cap = out_n * 4 + 1;
    }
    for (size_t k = 0; k < out_n; k++) {
        if (v[k] & RAW_BYTE)
            (*buf)[o++] = (char)(v[k] & 0xFF);
        else
            o += ig__utf8_encode(v[k], *buf + o);
    }
    *outlen = o;
done:
    free(v);
    return rc;
}
