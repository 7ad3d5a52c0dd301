/*
 * Block hashes of the prefix cache (include/infergate/prefix_hash.h). The
 * mixer is splitmix64's finaliser, applied once per token and once per block
 * (over the block's length), so a token's place in the block matters and a
 * block never hashes like its parent.
 */
#include "infergate/prefix_hash.h"

#include "infergate/error.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ig_prefix_seed(const char *model_id)
{
    /* FNV-1a over the id, then mixed: a short name still spreads. */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)(model_id ? model_id : ""); *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return mix64(h ^ 0x7072656669780001ULL); /* "prefix", format 1 */
}

uint64_t ig_prefix_block_hash(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = parent;
    for (int i = 0; i < n; i++)
        h = mix64(h + 0x9e3779b97f4a7c15ULL + (uint64_t)(uint32_t)tokens[i]);
    return mix64(h ^ ((uint64_t)(uint32_t)n << 32));
}

int ig_prefix_hashes(uint64_t seed, const int32_t *tokens, int ntok, int block_size, uint64_t *out,
                     int cap)
{
    if (block_size <= 0 || ntok <= 0 || cap <= 0)
        return 0;
    int n = ntok / block_size;
    if (n > cap)
        n = cap;
    uint64_t h = seed;
    for (int i = 0; i < n; i++) {
        h = ig_prefix_block_hash(h, tokens + (size_t)i * block_size, block_size);
        out[i] = h;
    }
    return n;
}

void ig_prefix_hash_hex(uint64_t h, char out[17])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, h >>= 4)
        out[i] = hex[h & 15];
    out[16] = 0;
}

int ig_prefix_hash_parse(const char *s, size_t len, uint64_t *h)
{
    if (!s || len != 16)
        return IG_EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return IG_EINVAL;
        v = v << 4 | (uint64_t)d;
    }
    *h = v;
    return 0;
}
