/* test_hashslot.c — Redis Cluster's hash slots (CRC16-XMODEM, hash tags)
 * against known values, and the base of our companion keys: always in the
 * lock key's slot, whatever braces the key holds. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hashslot.h"

/* CRC16-XMODEM bit by bit, the definition the table-driven rl_crc16 must match. */
static unsigned crc16_bitwise(const char *buf, size_t len) {
    unsigned crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (int b = 0; b < 8; b++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

static int slot_of(const char *s) {
    return rl_hash_slot(s, strlen(s));
}

/* The base of key, NUL-terminated in a static buffer. */
static const char *base_of(const char *key) {
    static rl_buf b;
    static char out[256];
    CHECK_INT(rl_cluster_base(&b, key, strlen(key)), 0);
    memcpy(out, b.data, b.len);
    out[b.len] = '\0';
    return out;
}

/* Every companion name (head + base + tail) hashes to key's slot. */
static void check_companions(const char *key) {
    static const char *const heads[] = {"", "redlock:queue:", "redlock:slot:3:", "redlock:wake:0123abcd:"};
    const char *base = base_of(key);
    char name[512];
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        snprintf(name, sizeof(name), "%s%s%s", heads[i], base, i == 0 ? ":fence" : "");
        if (slot_of(name) != slot_of(key)) fprintf(stderr, "key %s: %s in slot %d\n", key, name, slot_of(name));
        CHECK_INT(slot_of(name), slot_of(key));
    }
}

int main(void) {
    /* the CRC16 check value, and slots Redis reports (CLUSTER KEYSLOT) */
    CHECK_INT(rl_crc16("123456789", 9), 0x31C3);
    /* the table against the bitwise definition: every byte alone, and strings of every
     * length up to 64 over all byte values (pseudo-random, fixed seed) */
    for (int c = 0; c < 256; c++) {
        char one = (char)c;
        CHECK_INT(rl_crc16(&one, 1), crc16_bitwise(&one, 1));
    }
    unsigned seed = 12345;
    char text[64];
    for (int round = 0; round < 2000; round++) {
        size_t len = (size_t)round % sizeof(text) + 1;
        for (size_t i = 0; i < len; i++) seed = seed * 1103515245u + 12345u, text[i] = (char)(seed >> 16);
        CHECK_INT(rl_crc16(text, len), crc16_bitwise(text, len));
    }
    CHECK_INT(slot_of("123456789"), 0x31C3 & 16383);
    CHECK_INT(slot_of("foo"), 12182);
    CHECK_INT(slot_of("bar"), 5061);
    CHECK_INT(slot_of(""), 0);
    /* tags: the first '{' and the first '}' after it, non-empty */
    CHECK_INT(slot_of("{user1000}.following"), slot_of("user1000"));
    CHECK_INT(slot_of("{user1000}.followers"), slot_of("user1000"));
    CHECK_INT(slot_of("foo{}{bar}"), rl_crc16("foo{}{bar}", 10) & 16383); /* empty first tag: the whole key */
    CHECK_INT(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    CHECK_INT(slot_of("foo{bar}{zap}"), slot_of("bar"));
    CHECK_INT(slot_of("a{b"), rl_crc16("a{b", 3) & 16383);
    CHECK_INT(slot_of("a}b{"), rl_crc16("a}b{", 4) & 16383);

    /* bases: a plain key wrapped, a key's own tag put in front, others given a tag of the same slot */
    CHECK_STR(base_of("orders"), "{orders}");
    CHECK_STR(base_of("app:{user7}:cart"), "{user7}app:{user7}:cart");
    /* a key that is another key's base gets a base of its own */
    CHECK_STR(base_of("{orders}"), "{orders}{orders}");
    CHECK(strcmp(base_of("{T}a}b"), "{T}{T}a}b") == 0);
    CHECK_STR(base_of("a{b"), "{a{b}");
    const char *odd = base_of("a}b");
    CHECK(odd[0] == '{' && strstr(odd, "}a}b") != NULL);
    const char *keys[] = {"orders", "x", "app:{user7}:cart", "a{b", "a}b", "{}x}", "}{", "{}", "}", "{",
                          "foo{}{bar}", "job:42", "{a}{b}"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) check_companions(keys[i]);
    /* no two keys share a base: each key, and each base taken as a key */
    char seen[2 * sizeof(keys) / sizeof(keys[0])][64];
    size_t nseen = 0;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        snprintf(seen[nseen++], sizeof(seen[0]), "%.60s", base_of(keys[i]));
        char as_key[64];
        snprintf(as_key, sizeof(as_key), "%.60s", seen[nseen - 1]);
        snprintf(seen[nseen++], sizeof(seen[0]), "%.60s", base_of(as_key));
    }
    for (size_t i = 0; i < nseen; i++)
        for (size_t j = i + 1; j < nseen; j++) CHECK(strcmp(seen[i], seen[j]) != 0);
    /* every slot has a tag (the search never comes back empty-handed):
     * keys "}<n>" of many slots */
    int missing = 0;
    for (int n = 0; n < 3000; n++) {
        char key[16];
        snprintf(key, sizeof(key), "}%d", n);
        const char *b = base_of(key);
        char name[64];
        snprintf(name, sizeof(name), "%s:fence", b);
        missing += slot_of(name) != slot_of(key);
    }
    CHECK_INT(missing, 0);
    return check_report("hashslot");
}
