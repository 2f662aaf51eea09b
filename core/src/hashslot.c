/* hashslot.c — Redis Cluster's hash slots and our companion keys' tag (see
 * hashslot.h). */
#include <string.h>

#include "hashslot.h"

unsigned rl_crc16(const char *buf, size_t len) {
    unsigned crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (int b = 0; b < 8; b++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

const char *rl_hash_tag(const char *key, size_t *len) {
    const char *open = memchr(key, '{', *len);
    if (open == NULL) return key;
    size_t rest = *len - (size_t)(open - key) - 1;
    const char *close = memchr(open + 1, '}', rest);
    if (close == NULL || close == open + 1) return key; /* no '}' after it, or an empty tag */
    *len = (size_t)(close - open - 1);
    return open + 1;
}

int rl_hash_slot(const char *key, size_t len) {
    const char *tag = rl_hash_tag(key, &len);
    return (int)(rl_crc16(tag, len) & (RL_HASH_SLOTS - 1));
}

/* The search order of the tag T (rl_cluster_base): strings over these 62
 * characters, shortest first, then in this order. Three characters give
 * 238,328 strings; every slot is reached well before (checked by a test). */
static const char tag_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/* The first tag of at most 3 characters whose slot is slot: its length,
 * written into out, or 0 if there is none. */
static size_t tag_for_slot(int slot, char out[3]) {
    const size_t n = sizeof(tag_chars) - 1;
    for (size_t len = 1; len <= 3; len++) {
        size_t count = len == 1 ? n : len == 2 ? n * n : n * n * n;
        for (size_t k = 0; k < count; k++) {
            size_t v = k;
            for (size_t i = len; i-- > 0; v /= n) out[i] = tag_chars[v % n];
            if ((int)(rl_crc16(out, len) & (RL_HASH_SLOTS - 1)) == slot) return len;
        }
    }
    return 0;
}

int rl_cluster_base(rl_buf *b, const char *key, size_t len) {
    size_t tlen = len;
    const char *tag = rl_hash_tag(key, &tlen);
    char found[3];
    size_t flen = 0;
    int own = tag != key || tlen != len; /* a valid tag of its own */
    int wrap = !own && memchr(key, '}', len) == NULL;
    if (!own && !wrap) flen = tag_for_slot(rl_hash_slot(key, len), found);
    b->len = 0;
    if (rl_buf_reserve(b, len + 8) != 0) return -1;
    char *p = b->data;
    if (wrap) *p++ = '{';
    if (flen) {
        *p++ = '{';
        memcpy(p, found, flen);
        p += flen;
        *p++ = '}';
    }
    memcpy(p, key, len);
    p += len;
    if (wrap) *p++ = '}';
    b->len = (size_t)(p - b->data);
    return 0;
}
