/* command.c — RESP encoding of SET NX PX and the release/extend scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "redlock.h"

const char rl_release_script[] =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";
const char rl_extend_script[] =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"pexpire\",KEYS[1],ARGV[2]) else return 0 end";
const char rl_release_sha[] = "b70c2384248f88e6b75b9f89241a180f856ad852";
const char rl_extend_sha[] = "36e94d1c6e02fcefaa7ee5d79eee614dbac55f10";

void rl_buf_free(rl_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* Room for extra more bytes and the NUL kept after the content: hiredis 0.14
 * scans a pre-formatted command with strchr, so it must be a C string too. */
static int reserve(rl_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static int append_header(rl_buf *b, char kind, size_t n) {
    if (reserve(b, 24) != 0) return -1;
    b->len += (size_t)snprintf(b->data + b->len, 24, "%c%zu\r\n", kind, n);
    return 0;
}

static int append_bulk(rl_buf *b, const char *s, size_t n) {
    if (append_header(b, '$', n) != 0 || reserve(b, n + 2) != 0) return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    memcpy(b->data + b->len, "\r\n", 3);
    b->len += 2;
    return 0;
}

static int append_str(rl_buf *b, const char *s) {
    return append_bulk(b, s, strlen(s));
}

static int append_int(rl_buf *b, int v) {
    char digits[16];
    int n = snprintf(digits, sizeof(digits), "%d", v);
    return append_bulk(b, digits, (size_t)n);
}

int rl_cmd_acquire(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms) {
    b->len = 0;
    return append_header(b, '*', 6) | append_str(b, "SET") | append_bulk(b, key, keylen) |
           append_bulk(b, value, RL_VALUE_LEN) | append_str(b, "NX") | append_str(b, "PX") |
           append_int(b, ttl_ms);
}

static int script_head(rl_buf *b, int argc, int by_sha, const char *sha, const char *script) {
    b->len = 0;
    return append_header(b, '*', (size_t)argc) | append_str(b, by_sha ? "EVALSHA" : "EVAL") |
           append_str(b, by_sha ? sha : script) | append_str(b, "1");
}

int rl_cmd_release(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value) {
    return script_head(b, 5, by_sha, rl_release_sha, rl_release_script) | append_bulk(b, key, keylen) |
           append_bulk(b, value, RL_VALUE_LEN);
}

int rl_cmd_extend(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value, int ttl_ms) {
    return script_head(b, 6, by_sha, rl_extend_sha, rl_extend_script) | append_bulk(b, key, keylen) |
           append_bulk(b, value, RL_VALUE_LEN) | append_int(b, ttl_ms);
}
