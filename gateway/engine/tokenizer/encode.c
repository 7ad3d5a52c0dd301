/*
 * Encoding and decoding: added-token matching, normalization (NFC through
 * libutf8proc), the pre-tokenizer (Split patterns through PCRE2, split.c),
 * BPE with a priority queue over a linked list of symbols, and decoding with
 * a streaming variant that never splits a UTF-8 character.
 */
#include "internal.h"

#include "infergate/error.h"
#include "infergate/utf8.h"

#include <utf8proc.h>

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

int ig_tokenizer_utf8_check(const char *s, size_t len, size_t *bad_offset)
{
    size_t ok = ig_utf8_valid_prefix(s, len);
    if (ok == len)
        return 0;
    if (bad_offset)
        *bad_offset = ok;
    return IG_EPARSE;
}

/* ------------------------------------------------------------------------ */
/* Unicode (libutf8proc)                                                    */
/* ------------------------------------------------------------------------ */

#define CP_BAD 0xFFFFFFFFu /* an invalid byte: neither letter nor number */

static size_t cp_at(const unsigned char *s, size_t n, size_t i, uint32_t *cp)
{
    size_t l;
    if (i >= n) {
        *cp = CP_BAD;
        return 0;
    }
    if (s[i] < 0x80) {
        *cp = s[i];
        return 1;
    }
    l = ig_utf8_decode((const char *)s + i, n - i, cp);
    if (!l) {
        *cp = CP_BAD;
        l = 1;
    }
    return l;
}

/* \p{L}, \p{N} or '_': the word characters of `single_word`. */
static int is_word_char(uint32_t c)
{
    utf8proc_category_t k;
    if (c < 0x80)
        return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
    if (c == CP_BAD)
        return 0;
    k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Unicode White_Space, as Rust's char::is_whitespace (lstrip / rstrip):
 * the Zs, Zl and Zp characters, \t..\r and U+0085. */
static int is_s(uint32_t c)
{
    utf8proc_category_t k;
    if (c < 0x80)
        return c == ' ' || (c >= '\t' && c <= '\r');
    if (c == 0x85)
        return 1;
    if (c == CP_BAD)
        return 0;
    k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_ZS && k <= UTF8PROC_CATEGORY_ZP;
}

/* Whether NFC leaves cp alone wherever it stands: a starter (combining
 * class 0) without a canonical decomposition that takes part in no
 * composition. Conjoining jamo compose by arithmetic, not through the
 * tables, so they never count as inert. utf8proc 2.9 changed how
 * comb_index is stored; with another version every character at U+0300 and
 * above counts as not inert, which is slower but still right. */
static int nfc_inert(uint32_t cp)
{
#if UTF8PROC_VERSION_MAJOR == 2 && UTF8PROC_VERSION_MINOR <= 8
    const utf8proc_property_t *p;
    if (cp >= 0x1100 && cp <= 0x11FF)
        return 0;
    p = utf8proc_get_property((utf8proc_int32_t)cp);
    return p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
           p->comb_index == UINT16_MAX;
#else
    (void)cp;
    return 0;
#endif
}

int ig__nfc_needed(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l;
        if (s[i] < 0xCC) { /* below U+0300 (or a byte of an invalid sequence) */
            i++;
            continue;
        }
        l = ig_utf8_decode((const char *)s + i, n - i, &cp);
        if (!l) {
            i++;
            continue;
        }
        if (!nfc_inert(cp))
            return 1;
        i += l;
    }
    return 0;
}

/* Writes the NFC form of s[0..n) into *buf (capacity *cap) and its length
 * into *outlen. Each valid stretch goes through utf8proc; invalid bytes pass
 * through unchanged. Returns 0 or IG_ENOMEM. */
static int nfc(const unsigned char *s, size_t n, char **buf, size_t *cap, size_t *outlen)
{
    size_t i = 0, o = 0;
    while (i < n) {
        size_t j = i, need;
        const unsigned char *part;
        utf8proc_uint8_t *mapped = NULL;
        utf8proc_ssize_t ml = 0;
        while (j < n) {
            size_t l = s[j] < 0x80 ? 1 : ig_utf8_decode((const char *)s + j, n - j, NULL);
            if (!l)
                break;
            j += l;
        }
        if (j > i) {
            ml = utf8proc_map(s + i, (utf8proc_ssize_t)(j - i), &mapped,
                              UTF8PROC_COMPOSE | UTF8PROC_STABLE);
            if (ml < 0)
                return IG_ENOMEM; /* valid input: only its allocation can fail */
            part = mapped;
        } else { /* one invalid byte */
            j = i + 1;
            part = s + i;
            ml = 1;
        }
        need = o + (size_t)ml + 1;
        if (need > *cap) {
            size_t c = *cap ? *cap : 64;
            char *nb;
            while (c < need)
                c *= 2;
            if (!(nb = realloc(*buf, c))) {
                free(mapped);
                return IG_ENOMEM;
            }
            *buf = nb;
            *cap = c;
        }
        memcpy(*buf + o, part, (size_t)ml);
        o += (size_t)ml;
        free(mapped);
        i = j;
    }
    *outlen = o;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Cuts that are not regexes                                                */
/* ------------------------------------------------------------------------ */

/* The metaspace U+2581 (sentencepiece's space), UTF-8. */
static const char META[] = "\xE2\x96\x81";

static int at_meta(const unsigned char *s, size_t n, size_t j)
{
    return n - j >= 3 && memcmp(s + j, META, 3) == 0;
}

/* A piece from i: its leading metaspaces (only the first unless
 * all_leading), then up to the next one. Metaspace's split takes one,
 * sentencepiece's runs take every one. */
static size_t cut_meta(const unsigned char *s, size_t n, size_t i, int all_leading)
{
    size_t j = i;
    while (at_meta(s, n, j)) {
        j += 3;
        if (!all_leading)
            break;
    }
    while (j < n && !at_meta(s, n, j))
        j++;
    return j - i;
}

/* ------------------------------------------------------------------------ */
/* BPE                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
    const ig_tokenizer_t *tok;
    ig_tokvec_t *out;
    char *nb[2]; /* normalization buffers */
    size_t ncap[2];
    int32_t *sid, *prev, *next; /* (symbols) linked list of the word */
    size_t symcap;
    uint64_t *heap; /* rank << 32 | position, min first */
    size_t nheap, heapcap;
    char *wb; /* the word in vocabulary spelling (ignore_merges) */
    size_t wcap;
    /* Word cache for long inputs, private to one call so that the tokenizer
     * stays immutable and shareable between threads. */
    uint32_t *cslot; /* entry index + 1, 0 empty */
    size_t cmask;
    struct cache_ent_s {
        uint64_t hash;
        uint32_t boff, blen; /* word bytes in cbytes */
        uint32_t ioff, ilen; /* ids in cids */
    } * cent;
    size_t ncent, capcent;
    char *cbytes;
    size_t nbytes, capbytes;
    int32_t *cids;
    size_t nids, capids;
    pcre2_match_data *md; /* for the Split steps, made on first use */
} enc_t;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t c = *cap ? *cap : 64;
    void *n;
    if (need <= *cap)
        return 0;
    while (c < need)
        c *= 2;
    if (!(n = realloc(*p, c * elem)))
        return IG_ENOMEM;
    *p = n;
    *cap = c;
    return 0;
}

static int emit(enc_t *e, int32_t id)
{
    ig_tokvec_t *v = e->out;
    if (v->len == v->cap && grow((void **)&v->ids, &v->cap, v->len + 1, sizeof *v->ids))
        return IG_ENOMEM;
    v->ids[v->len++] = id;
    return 0;
}

/* Looks a pair up; returns its rank and sets *out, or -1. */
static int32_t merge_find(const ig_tokenizer_t *tok, int32_t a, int32_t b, int32_t *out)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = (size_t)ig__hash_pair(key) & tok->mh_mask;
    for (;;) {
        uint64_t k = tok->mh_key[i];
        if (k == key) {
            *out = tok->mh_out[i];
            return tok->mh_rank[i];
        }
        if (k == UINT64_MAX)
            return -1;
        i = (i + 1) & tok->mh_mask;
    }
}

static void heap_push(enc_t *e, uint64_t v)
{
    size_t i = e->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (e->heap[p] <= v)
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = v;
}

static uint64_t heap_pop(enc_t *e)
{
    uint64_t top = e->heap[0], v = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && e->heap[c + 1] < e->heap[c])
            c++;
        if (v <= e->heap[c])
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = v;
    return top;
}

static void push_pair(enc_t *e, int32_t pos)
{
    int32_t nx = e->next[pos], out, r;
    if (nx < 0)
        return;
    r = merge_find(e->tok, e->sid[pos], e->sid[nx], &out);
    if (r >= 0)
        heap_push(e, (uint64_t)(uint32_t)r << 32 | (uint32_t)pos);
}

/* Runs the merges over the m symbols in e->sid and emits the result. */
static int bpe_merge(enc_t *e, size_t m)
{
    const ig_tokenizer_t *tok = e->tok;
    int32_t prev_emitted = -1;
    int rc;
    if (grow((void **)&e->heap, &e->heapcap, m * 2 + 1, sizeof *e->heap))
        return IG_ENOMEM;
    e->nheap = 0;
    for (size_t i = 0; i < m; i++) {
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < m; i++)
        push_pair(e, (int32_t)i);
    while (e->nheap) {
        uint64_t top = heap_pop(e);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32), nx, out = -1;
        if (e->sid[pos] < 0 || (nx = e->next[pos]) < 0)
            continue;
        /* Stale entry: the pair at pos changed since it was queued. */
        if (merge_find(tok, e->sid[pos], e->sid[nx], &out) != rank)
            continue;
        e->sid[pos] = out;
        e->sid[nx] = -1;
        e->next[pos] = e->next[nx];
        if (e->next[nx] >= 0)
            e->prev[e->next[nx]] = pos;
        /* Each merge queues at most two pairs, so the heap stays within 2m. */
        if (e->prev[pos] >= 0)
            push_pair(e, e->prev[pos]);
        push_pair(e, pos);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) {
        int32_t id = e->sid[i];
        if (tok->fuse_unk && id == tok->unk_id && prev_emitted == tok->unk_id)
            continue;
        if ((rc = emit(e, id)) != 0)
            return rc;
        prev_emitted = id;
    }
    return 0;
}

static int ensure_syms(enc_t *e, size_t m)
{
    size_t c1 = e->symcap, c2 = e->symcap, c3 = e->symcap;
    if (m <= e->symcap)
        return 0;
    if (grow((void **)&e->sid, &c1, m, sizeof *e->sid) ||
        grow((void **)&e->prev, &c2, m, sizeof *e->prev) ||
        grow((void **)&e->next, &c3, m, sizeof *e->next))
        return IG_ENOMEM;
    e->symcap = c1 < c2 ? (c1 < c3 ? c1 : c3) : (c2 < c3 ? c2 : c3);
    return 0;
}

static int word_bytelevel(enc_t *e, const unsigned char *w, size_t n)
{
    const ig_tokenizer_t *tok = e->tok;
    int rc;
    if (tok->ignore_merges && n > 1) {
        size_t o = 0;
        int32_t id;
        if (grow((void **)&e->wb, &e->wcap, n * 2, 1))
            return IG_ENOMEM;
        for (size_t i = 0; i < n; i++)
            o += ig_utf8_encode(ig__byte_to_cp(w[i]), e->wb + o);
        if ((id = ig_tokenizer_token_id(tok, e->wb, o)) >= 0)
            return emit(e, id);
    }
    if ((rc = ensure_syms(e, n)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[w[i]];
        e->sid[i] = id >= 0 ? id : tok->unk_id;
    }
    if (n == 1)
        return emit(e, e->sid[0]);
    return bpe_merge(e, n);
}

static int word_sentencepiece(enc_t *e, const unsigned char *w, size_t n)
{
    const ig_tokenizer_t *tok = e->tok;
    size_t m = 0, i = 0;
    int rc;
    if (tok->ignore_merges || n == 1) {
        int32_t id = ig_tokenizer_token_id(tok, (const char *)w, n);
        if (id >= 0)
            return emit(e, id);
    }
    /* At most one symbol per byte, byte fallback included. */
    if ((rc = ensure_syms(e, n)) != 0)
        return rc;
    while (i < n) {
        uint32_t cp;
        size_t l = ig_utf8_decode((const char *)w + i, n - i, &cp);
        int32_t id = -1;
        if (l == 1 && w[i] < 0x80)
            id = tok->ascii_id[w[i]];
        else if (l)
            id = ig_tokenizer_token_id(tok, (const char *)w + i, l);
        else
            l = 1; /* an invalid byte: only byte fallback can carry it */
        if (id >= 0) {
            e->sid[m++] = id;
        } else if (tok->byte_fallback) {
            for (size_t k = 0; k < l; k++)
                e->sid[m++] = tok->fb_id[w[i + k]];
        } else if (tok->unk_id >= 0) {
            e->sid[m++] = tok->unk_id;
        } else {
            return IG_ETOKENIZER;
        }
        i += l;
    }
    if (m == 1)
        return emit(e, e->sid[0]);
    return bpe_merge(e, m);
}

/* Words longer than this are not cached: they are rare and cost memory. */
#define CACHE_MAX_WORD 64
/* Entries per call at most; past that, words are encoded without caching. */
#define CACHE_MAX_ENTRIES 65536

static int cache_init(enc_t *e)
{
    e->cmask = CACHE_MAX_ENTRIES * 2 - 1;
    if (!(e->cslot = calloc(e->cmask + 1, sizeof *e->cslot)))
        return IG_ENOMEM;
    return 0;
}

/* BPE for one pre-token, through the cache when there is one. */
static int encode_word(enc_t *e, const unsigned char *w, size_t l)
{
    const ig_tokenizer_t *tok = e->tok;
    size_t before = e->out->len, slot = 0, nids;
    uint64_t h = 0;
    int rc, cacheable = e->cslot && l <= CACHE_MAX_WORD;
    if (cacheable) {
        h = ig__hash_bytes((const char *)w, l);
        slot = (size_t)h & e->cmask;
        for (;;) {
            uint32_t k = e->cslot[slot];
            const struct cache_ent_s *c;
            if (!k)
                break;
            c = &e->cent[k - 1];
            if (c->hash == h && c->blen == l && memcmp(e->cbytes + c->boff, w, l) == 0) {
                ig_tokvec_t *v = e->out;
                if (grow((void **)&v->ids, &v->cap, v->len + c->ilen, sizeof *v->ids))
                    return IG_ENOMEM;
                memcpy(v->ids + v->len, e->cids + c->ioff, c->ilen * sizeof *v->ids);
                v->len += c->ilen;
                return 0;
            }
            slot = (slot + 1) & e->cmask;
        }
    }
    rc = tok->style == IG_TOKENIZER_BYTE_LEVEL ? word_bytelevel(e, w, l)
                                               : word_sentencepiece(e, w, l);
    if (rc != 0 || !cacheable || e->ncent >= CACHE_MAX_ENTRIES)
        return rc;
    nids = e->out->len - before;
    if (grow((void **)&e->cent, &e->capcent, e->ncent + 1, sizeof *e->cent) ||
        grow((void **)&e->cbytes, &e->capbytes, e->nbytes + l, 1) ||
        grow((void **)&e->cids, &e->capids, e->nids + nids, sizeof *e->cids))
        return IG_ENOMEM;
    e->cent[e->ncent].hash = h;
    e->cent[e->ncent].boff = (uint32_t)e->nbytes;
    e->cent[e->ncent].blen = (uint32_t)l;
    e->cent[e->ncent].ioff = (uint32_t)e->nids;
    e->cent[e->ncent].ilen = (uint32_t)nids;
    memcpy(e->cbytes + e->nbytes, w, l);
    memcpy(e->cids + e->nids, e->out->ids + before, nids * sizeof *e->cids);
    e->nbytes += l;
    e->nids += nids;
    e->cslot[slot] = (uint32_t)++e->ncent;
    return 0;
}

/* Writes prefix + s with every pat replaced by rep into the other scratch
 * buffer; returns it, or NULL when out of memory. */
static const unsigned char *rewrite(enc_t *e, int *cur, const unsigned char *s, size_t *n,
                                    const char *prefix, size_t plen, const char *pat, size_t patlen,
                                    const char *rep, size_t replen)
{
    size_t len = *n, o = 0, i = 0;
    size_t need = plen + len + (pat ? len / patlen * replen : 0) + 1;
    char *dst;
    if (grow((void **)&e->nb[*cur], &e->ncap[*cur], need, 1))
        return NULL;
    dst = e->nb[*cur];
    if (plen)
        memcpy(dst, prefix, plen);
    o = plen;
    while (i < len) {
        if (pat && len - i >= patlen && memcmp(s + i, pat, patlen) == 0) {
            memcpy(dst + o, rep, replen);
            o += replen;
            i += patlen;
        } else {
            dst[o++] = (char)s[i++];
        }
    }
    *cur ^= 1;
    *n = o;
    return (const unsigned char *)dst;
}

/* A piece of Split step `step`, handed on to the next step or to BPE. */
typedef struct {
    enc_t *e;
    size_t step;
} piece_ctx_t;

static int piece(void *ctx, const unsigned char *p, size_t n)
{
    piece_ctx_t *pc = ctx;
    piece_ctx_t next = {pc->e, pc->step + 1};
    const ig_tokenizer_t *tok = pc->e->tok;
    if (next.step == tok->n_splits)
        return encode_word(pc->e, p, n);
    return ig__split_run(&tok->splits[next.step], pc->e->md, p, n, piece, &next);
}

/* Runs the Split steps over t[0..n). PCRE2 matches valid UTF-8 only (the
 * tokenizers library never sees anything else): each maximal run of invalid
 * bytes is a piece of its own, given to BPE as it is, and the valid text
 * between such runs is split on its own. */
static int split_text(enc_t *e, const unsigned char *t, size_t n)
{
    piece_ctx_t first = {e, 0};
    size_t i = 0;
    int rc;
    if (!e->md && !(e->md = pcre2_match_data_create(1, NULL)))
        return IG_ENOMEM;
    while (i < n) {
        size_t ok = ig_utf8_valid_prefix((const char *)t + i, n - i), j;
        if (ok && (rc = ig__split_run(&e->tok->splits[0], e->md, t + i, ok, piece, &first)) != 0)
            return rc;
        i += ok;
        for (j = i; j < n; j++) {
            if (t[j] < 0x80 || ig_utf8_decode((const char *)t + j, n - j, NULL))
                break;
        }
        if (j > i && (rc = encode_word(e, t + i, j - i)) != 0)
            return rc;
        i = j;
    }
    return 0;
}

/* Encodes one stretch of text between added tokens: normalizers, then the
 * pre-tokenizer (prefix space or metaspace, split), then BPE per word. */
static int encode_segment(enc_t *e, const unsigned char *s, size_t n, int first)
{
    const ig_tokenizer_t *tok = e->tok;
    const unsigned char *t = s;
    size_t i = 0;
    int cur = 0, rc;
    if (n == 0)
        return 0;
    for (size_t k = 0; k < tok->n_norms && t; k++) {
        const ig__norm_t *nm = &tok->norms[k];
        if (nm->kind == IG__NORM_PREPEND) {
            if (n)
                t = rewrite(e, &cur, t, &n, nm->a, nm->alen, NULL, 0, NULL, 0);
        } else if (nm->kind == IG__NORM_NFC) {
            if (ig__nfc_needed(t, n)) {
                if (nfc(t, n, &e->nb[cur], &e->ncap[cur], &n) != 0)
                    return IG_ENOMEM;
                t = (const unsigned char *)e->nb[cur];
                cur ^= 1;
            }
        } else {
            t = rewrite(e, &cur, t, &n, NULL, 0, nm->a, nm->alen, nm->b, nm->blen);
        }
    }
    if (t && tok->style == IG_TOKENIZER_BYTE_LEVEL && tok->add_prefix_space && n && t[0] != ' ')
        t = rewrite(e, &cur, t, &n, " ", 1, NULL, 0, NULL, 0);
    if (t && tok->metaspace) {
        int pre = n && (tok->meta_prepend == 1 || (tok->meta_prepend == 2 && first)) &&
                  t[0] != ' ' && !at_meta(t, n, 0);
        t = rewrite(e, &cur, t, &n, META, pre ? 3 : 0, " ", 1, META, 3);
    }
    if (!t)
        return IG_ENOMEM;
    if (tok->n_splits)
        return split_text(e, t, n);
    if (tok->cut == IG__CUT_NONE)
        return encode_word(e, t, n);
    while (i < n) {
        size_t l = cut_meta(t, n, i, tok->cut != IG__CUT_METASPACE);
        if ((rc = encode_word(e, t + i, l)) != 0)
            return rc;
        i += l;
    }
    return 0;
}

/* The code point that ends just before s[i] (i > 0), invalid bytes as CP_BAD. */
static uint32_t cp_before(const unsigned char *s, size_t i, size_t *start)
{
    size_t j = i - 1, k = 0;
    uint32_t cp;
    while (j > 0 && k < 3 && (s[j] & 0xC0) == 0x80) {
        j--;
        k++;
    }
    if (ig_utf8_decode((const char *)s + j, i - j, &cp) != i - j) {
        j = i - 1;
        cp = CP_BAD;
    }
    *start = j;
    return cp;
}

/* The longest added token at s[i..n) that may match there, or NULL. A
 * special token must also end by special_end (the end of a marker span). */
static const ig__added_t *match_added(const ig_tokenizer_t *tok, const unsigned char *s, size_t n,
                                      size_t i, unsigned flags, size_t special_end)
{
    for (size_t k = 0; k < tok->n_added; k++) {
        const ig__added_t *a = &tok->added[k];
        if (a->len > n - i || (unsigned char)a->content[0] != s[i])
            continue;
        if (a->special && ((flags & IG_TOKENIZER_NO_SPECIAL) || a->len > special_end - i))
            continue;
        if (memcmp(a->content, s + i, a->len) != 0)
            continue;
        if (a->single_word) {
            size_t st;
            uint32_t after;
            if (i > 0 && is_word_char(cp_before(s, i, &st)))
                continue;
            if (i + a->len < n && cp_at(s, n, i + a->len, &after) && is_word_char(after))
                continue;
        }
        return a;
    }
    return NULL;
}

/*
 * The one encoder. With marks, special tokens are matched only inside them
 * (sorted, disjoint byte spans); outside, as with IG_TOKENIZER_NO_SPECIAL.
 * The stretches between the tokens found are encoded exactly as without
 * marks, so text whose unmarked parts spell no special token gets the same
 * ids either way.
 */
static int encode_marked(const ig_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                         const ig_tokspan_t *marks, size_t nmarks, ig_tokvec_t *out)
{
    enc_t e;
    const unsigned char *s = (const unsigned char *)text;
    size_t seg = 0, i = 0, start_len = out->len, m = 0;
    int rc = 0;

    memset(&e, 0, sizeof e);
    e.tok = tok;
    e.out = out;
    /* Short prompts do not repeat words enough to pay for the table. */
    if (len >= 4096 && (rc = cache_init(&e)) != 0)
        goto fail;
    if ((flags & IG_TOKENIZER_ADD_BOS) && tok->add_bos && tok->bos_id >= 0 &&
        (rc = emit(&e, tok->bos_id)) != 0)
        goto fail;
    while (i < len) {
        const ig__added_t *a = NULL;
        size_t end = i;
        if (tok->added_first[s[i]]) {
            size_t special_end = len;
            if (marks != NULL) {
                while (m < nmarks && marks[m].off + marks[m].len <= i)
                    m++;
                special_end = m < nmarks && marks[m].off <= i ? marks[m].off + marks[m].len : i;
            }
            a = match_added(tok, s, len, i, flags, special_end);
        }
        if (!a) {
            i++;
            continue;
        }
        /* lstrip / rstrip: the whitespace beside the token goes with it. */
        while (a->lstrip && end > seg) {
            size_t st;
            if (!is_s(cp_before(s, end, &st)) || st < seg)
                break;
            end = st;
        }
        if ((rc = encode_segment(&e, s + seg, end - seg, seg == 0)) != 0 ||
            (rc = emit(&e, a->id)) != 0)
            goto fail;
        i += a->len;
        while (a->rstrip && i < len) {
            uint32_t c;
            size_t l = cp_at(s, len, i, &c);
            if (!is_s(c))
                break;
            i += l;
        }
        seg = i;
    }
    rc = encode_segment(&e, s + seg, len - seg, seg == 0);
fail:
    if (rc != 0)
        out->len = start_len;
    free(e.nb[0]);
    free(e.nb[1]);
    free(e.sid);
    free(e.prev);
    free(e.next);
    free(e.heap);
    free(e.wb);
    free(e.cslot);
    free(e.cent);
    free(e.cbytes);
    free(e.cids);
    pcre2_match_data_free(e.md);
    return rc;
}

int ig_tokenizer_encode(const ig_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                        ig_tokvec_t *out)
{
    return encode_marked(tok, text, len, flags, NULL, 0, out);
}

int ig_tokenizer_encode_marked(const ig_tokenizer_t *tok, const char *text, size_t len,
                               unsigned flags, const ig_tokspan_t *marks, size_t nmarks,
                               ig_tokvec_t *out)
{
    for (size_t k = 0; k < nmarks; k++)
        if (marks[k].off > len || marks[k].len > len - marks[k].off ||
            (k > 0 && marks[k].off < marks[k - 1].off + marks[k - 1].len))
            return IG_EINVAL;
    if (nmarks == 0) /* nothing marked: nothing special */
        return encode_marked(tok, text, len, flags | IG_TOKENIZER_NO_SPECIAL, NULL, 0, out);
    return encode_marked(tok, text, len, flags, marks, nmarks, out);
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

/* Copies valid UTF-8 from s[0..n) to out, replacing each maximal invalid
 * subpart with U+FFFD. Unless final, stops before an incomplete character at
 * the end (it may still be completed by the next token). Returns the bytes
 * consumed; *olen gets the bytes written (out has room for 3 * n). */
static size_t lossy_utf8(const unsigned char *s, size_t n, int final, char *out, size_t *olen)
{
    const char *c = (const char *)s;
    size_t end = final ? n : n - ig_utf8_incomplete_tail(c, n);
    *olen = ig_utf8_replace(c, end, out);
    return end;
}

int ig_tokenizer_decode(const ig_tokenizer_t *tok, const int32_t *ids, size_t n, unsigned flags,
                        char **out, size_t *outlen)
{
    size_t total = 0, o = 0, olen;
    unsigned char *raw = NULL;
    char *res = NULL;
    int rc = 0;

    *out = NULL;
    *outlen = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= tok->n_ids || !tok->str[ids[i]])
            return IG_EINVAL;
        total += tok->bytes_len[ids[i]];
    }
    if (!(raw = malloc(total + 1)) || !(res = malloc(total * 3 + 1))) {
        rc = IG_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if ((flags & IG_TOKENIZER_SKIP_SPECIAL) && tok->special[ids[i]] == 1)
            continue;
        memcpy(raw + o, tok->bytes[ids[i]], tok->bytes_len[ids[i]]);
        o += tok->bytes_len[ids[i]];
    }
    {
        size_t skip = (tok->strip_leading_space && o && raw[0] == ' ') ? 1 : 0;
        lossy_utf8(raw + skip, o - skip, 1, res, &olen);
    }
    res[olen] = 0;
    free(raw);
    *out = res;
    *outlen = olen;
    return 0;
fail:
    free(raw);
    free(res);
    return rc;
}

void ig_tokdec_init(ig_tokdec_t *d, const ig_tokenizer_t *tok, unsigned flags)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->flags = flags;
}

void ig_tokdec_dispose(ig_tokdec_t *d)
{
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}

static int tokdec_run(ig_tokdec_t *d, const unsigned char *b, size_t n, int final,
                      const char **text, size_t *len)
{
    unsigned char tmp[4 + 256];
    unsigned char *in = tmp;
    size_t total = d->npend + n, used, olen;
    if (grow((void **)&d->buf, &d->cap, total * 3 + 1, 1))
        return IG_ENOMEM;
    if (total > sizeof tmp && !(in = malloc(total)))
        return IG_ENOMEM;
    memcpy(in, d->pend, d->npend);
    if (n)
        memcpy(in + d->npend, b, n);
    used = lossy_utf8(in, total, final, d->buf, &olen);
    /* What is left is an incomplete character: at most 3 bytes. */
    d->npend = total - used;
    memcpy(d->pend, in + used, d->npend);
    if (in != tmp)
        free(in);
    d->buf[olen] = 0;
    *text = d->buf;
    *len = olen;
    return 0;
}

int ig_tokdec_push(ig_tokdec_t *d, int32_t id, const char **text, size_t *len)
{
    const ig_tokenizer_t *tok = d->tok;
    const unsigned char *b;
    size_t n;
    *text = "";
    *len = 0;
    if (id < 0 || (size_t)id >= tok->n_ids || !tok->str[id])
        return IG_EINVAL;
    if ((d->flags & IG_TOKENIZER_SKIP_SPECIAL) && tok->special[id] == 1)
        return 0;
    b = (const unsigned char *)tok->bytes[id];
    n = tok->bytes_len[id];
    if (!d->started && n) {
        d->started = 1;
        if (tok->strip_leading_space && b[0] == ' ') {
            b++;
            n--;
        }
    }
    return tokdec_run(d, b, n, 0, text, len);
}

int ig_tokdec_flush(ig_tokdec_t *d, const char **text, size_t *len)
{
    return tokdec_run(d, NULL, 0, 1, text, len);
}
