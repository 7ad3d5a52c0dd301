/*
 * Strict UTF-8. One table-free scan decides everything: the lead byte gives
 * the length and the allowed range of the second byte (which is where
 * overlongs, surrogates and values above U+10FFFF are ruled out); every later
 * byte is a plain continuation byte.
 */
#include "infergate/utf8.h"

#include <stdint.h>
#include <string.h>

/* Looks at s[0..len) (len > 0). Returns the length of a complete valid
 * character with *complete = 1; else the length of the longest prefix of s
 * that could still start one (0 when s[0] cannot), with *complete = 0. */
static size_t scan(const unsigned char *s, size_t len, int *complete)
{
    unsigned char b = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    *complete = 0;
    if (b < 0x80) {
        *complete = 1;
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0; /* below: overlong */
        else if (b == 0xED)
            hi = 0x9F; /* above: a surrogate */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90; /* below: overlong */
        else if (b == 0xF4)
            hi = 0x8F; /* above: beyond U+10FFFF */
    } else {
        return 0; /* a continuation byte, C0, C1 or F5..FF */
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= len || s[k] < lo || s[k] > hi)
            return k;
        lo = 0x80;
        hi = 0xBF;
    }
    *complete = 1;
    return need;
}

size_t ig_utf8_decode(const char *str, size_t len, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    int complete;
    if (len == 0)
        return 0;
    size_t n = scan(s, len, &complete);
    if (!complete)
        return 0;
    uint32_t c;
    switch (n) {
    case 1:
        c = s[0];
        break;
    case 2:
        c = (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3Fu);
        break;
    case 3:
        c = (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3Fu);
        break;
    default:
        c = (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
            (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3Fu);
    }
    if (cp)
        *cp = c;
    return n;
}

size_t ig_utf8_invalid_len(const char *str, size_t len, int *truncated)
{
    const unsigned char *s = (const unsigned char *)str;
    int complete;
    size_t n = len ? scan(s, len, &complete) : 0;
    if (truncated)
        *truncated = n > 0 && n == len;
    return n ? n : 1;
}

size_t ig_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        int complete;
        /* ASCII, the common case, eight bytes at a time */
        uint64_t w;
        while (i + 8 <= len && (memcpy(&w, s + i, 8), (w & 0x8080808080808080ULL) == 0))
            i += 8;
        if (i == len)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t n = scan(s + i, len - i, &complete);
        if (!complete)
            break;
        i += n;
    }
    return i;
}

size_t ig_utf8_replace(const char *s, size_t len, char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        size_t l;
        if ((unsigned char)s[i] < 0x80) {
            out[o++] = s[i++];
            continue;
        }
        if ((l = ig_utf8_decode(s + i, len - i, NULL)) != 0) {
            memcpy(out + o, s + i, l);
            o += l;
            i += l;
            continue;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD */
        o += 3;
        i += ig_utf8_invalid_len(s + i, len - i, NULL);
    }
    return o;
}

int ig_utf8_valid(const char *s, size_t len)
{
    return ig_utf8_valid_prefix(s, len) == len;
}

size_t ig_utf8_incomplete_tail(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    /* A character is at most 4 bytes: its start is within the last 3. */
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        unsigned char c = s[len - k];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: its lead is further back */
        int complete;
        size_t n = scan(s + len - k, k, &complete);
        return !complete && n == k ? k : 0;
    }
    return 0;
}

size_t ig_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF)
        return 0;
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
