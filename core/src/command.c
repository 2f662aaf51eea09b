/* command.c — RESP encoding of SET NX PX and the release/extend scripts;
 * the fenced scripts' rule for a counter that is a token (rl_fence_token).
 *
 * On the hot path: one reserve, then the constant parts copied as literals
 * and the few numbers written by hand (no printf family). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "redlock.h"
#include "resp.h"
#include "shared.h"

/* A release that deletes the key tells the waiters (redlock.h, "Hand-off").
 * First the queue: the waiters queued on this node, oldest first, until one
 * still listens on its own wake channel ("1": the one woken); one that no
 * longer listens (gone, or given up) is dropped, at most 8 per release. With
 * no queued waiter woken, every listener on the resource's channel: the message is
 * their number, so that a waiter knows how many it competes with; with
 * nobody listening nothing is published. The script answers 2 instead of 1
 * when it published. pcall: a user that may not publish or use the queue
 * (an ACL, a key of another type) still releases, and its waiters poll. */
const char rl_release_script[] =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then redis.call(\"del\",KEYS[1]) "
    "if ARGV[2] == \"quiet\" then return 1 end " RL_WAKE_WAITERS("ARGV[2]") "else return 0 end";
const char rl_extend_script[] =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"pexpire\",KEYS[1],ARGV[2]) else return 0 end";
/* A waiter's acquire: SET NX PX; granted, the waiter leaves the queue;
 * refused, it joins the queue's end unless it is in it already (LPOS; a
 * node without LPOS, before Redis 6.0.6, moves it to the end). A waiter
 * woken by a release of another client has its turn (RL_TURN_PREFIX):
 * until it attempts, the releasing client's attempts are refused without
 * a SET. The turn ends when the releasing client finds the lock taken
 * again (by the waiter woken, or by someone first: a client older than
 * turns takes the lock without ending them), or the waiter woken not
 * listening on its wake channel (gone, or given up; or a node that will
 * not say: a user not allowed PUBSUB). The waiter woken ends its turn by
 * asking: granted, or refused (a caller outside the queue took the lock
 * first) and put back at the queue's front, to be woken first again. The
 * queue lives a minute past the last refused attempt of a waiter in it.
 * The work is bounded whatever the keys hold: LLEN first, and a queue
 * longer than RL_QUEUE_MAX (only others' writes make one), or a key of
 * another type, is left alone (not scanned, not joined, its expiry not
 * renewed); a full one (RL_QUEUE_MAX) takes nobody more. A waiter left out
 * hears the broadcast (a release that wakes no queued waiter) or polls;
 * SET NX decides the lock either way, the turn only who may ask. A waiting
 * writer also marks its intent while readers hold the resource (shared.h,
 * "Writer priority"), and clears it once granted. */
const char rl_acquire_queued_script[] =
    RL_BASE "local q, T, w = \"" RL_QUEUE_PREFIX "\"..B, \"" RL_TURN_PREFIX "\"..B, ARGV[3] "
    "local t, woken, by = redis.pcall(\"get\",T) "
    "if type(t) == \"string\" then woken, by = string.match(t, \"^(%x+) (%x+)$\") end "
    "if woken == w then redis.pcall(\"del\",T) "
    "elseif by == w then local s = redis.pcall(\"exists\",KEYS[1]) == 0 and "
    "redis.pcall(\"pubsub\",NUM,\"" RL_WAKE_PREFIX "\"..woken..\":\"..B) "
    "if type(s) ~= \"table\" or s.err or s[2] == 0 then redis.pcall(\"del\",T) by = nil end end "
    "if by ~= w and redis.call(\"set\",KEYS[1],ARGV[1],\"NX\",\"PX\",ARGV[2]) then "
    "local n = redis.pcall(\"llen\",q) "
    "if type(n) == \"number\" and n > 0 and n <= " STR(RL_QUEUE_MAX) " then redis.pcall(\"lrem\",q,0,w) end "
    RL_INTENT_GRANTED "return redis.status_reply(\"OK\") end " RL_INTENT_REFUSED
    "local n = redis.pcall(\"llen\",q) "
    "if type(n) ~= \"number\" or n > " STR(RL_QUEUE_MAX) " then return false end "
    "local p = redis.pcall(\"lpos\",q,w) "
    "if type(p) == \"table\" then local k = redis.pcall(\"lrem\",q,0,w) "
    "if type(k) == \"number\" then n = n - k end p = false end "
    "if not p then if n >= " STR(RL_QUEUE_MAX) " then return false end "
    "redis.pcall(woken == w and \"lpush\" or \"rpush\",q,w) end "
    "redis.pcall(\"pexpire\",q,60000) return false";
/* A fenced lock's scripts start by checking the counter, before anything
 * is written (Redis does not undo a script's writes when it fails later):
 * absent, or a positive integer as INCR keeps it (no sign, no leading zero,
 * at most 2^63-1, the largest INCR reaches), else an error reply naming the
 * key and what it holds; the acquire also refuses a counter at 2^63-1, which
 * no INCR can raise. Counters travel as decimal strings: Redis' Lua turns
 * integers into doubles, exact only up to 2^53. The grant answers GET of the
 * counter after its INCR (a bulk string); the commit compares decimal
 * strings by length, then bytes, which orders such integers exactly.
 * rl_fence_token is the same rule in C, for what the nodes answer. */
#define RL_COUNTER_CHECK                                                                                  \
    "local function shown(s, n) if #s > n then s = string.sub(s, 1, n - 3) .. \"...\" end "                \
    "return (string.gsub(s, \"[^%w%p ]\", \"?\")) end "                                                   \
    "local function fault(k, at_end) local t = redis.call(\"type\", k).ok "                                \
    "if t == \"none\" then return nil end "                                                               \
    "local what = \"is a \" .. t if t == \"string\" then local c = redis.call(\"get\", k) "                 \
    "if #c <= 19 and string.match(c, \"^[1-9]%d*$\") and (#c < 19 or c <= \"9223372036854775807\") then " \
    "if not at_end or c ~= \"9223372036854775807\" then return nil end "                                  \
    "return \"fence counter is at its end: \" .. shown(k, 64) .. \" holds \" .. c end "                     \
    "what = \"holds \\\"\" .. shown(c, 24) .. \"\\\"\" end "                                              \
    "return \"fence counter is not a positive integer: \" .. shown(k, 64) .. \" \" .. what end "
const char rl_acquire_fenced_script[] =
    RL_COUNTER_CHECK
    "local why = fault(KEYS[2], true) if why then return redis.error_reply(why) end "
    "if redis.call(\"set\",KEYS[1],ARGV[1],\"NX\",\"PX\",ARGV[2]) then redis.call(\"incr\",KEYS[2]) "
    "return redis.call(\"get\",KEYS[2]) else return false end";
const char rl_commit_script[] =
    RL_COUNTER_CHECK
    "if redis.call(\"get\",KEYS[1]) ~= ARGV[1] then return 0 end "
    "local why = fault(KEYS[2], false) if why then return redis.error_reply(why) end "
    "local c, t = redis.call(\"get\",KEYS[2]), ARGV[2] "
    "if not c or #c < #t or (#c == #t and c < t) then redis.call(\"set\",KEYS[2],t) end return 1";

int rl_fence_token(const char *s, size_t len, long long *token) {
    if (len < 1 || len > 19 || s[0] == '0') return 0;
    unsigned long long v = 0; /* 19 digits stay below 10^19 < 2^64: no overflow */
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > (unsigned long long)LLONG_MAX) return 0;
    *token = (long long)v;
    return 1;
}

const char rl_release_sha[] = "7205bbba00977f9b6b2fe01cccf64e0a4c625512";
const char rl_extend_sha[] = "36e94d1c6e02fcefaa7ee5d79eee614dbac55f10";

/* Byte i of prefix .. resource (i < plen + len). */
static char key_byte(const char *prefix, size_t plen, const char *resource, size_t i) {
    return i < plen ? prefix[i] : resource[i - plen];
}

int rl_key_in_namespace(const char *prefix, size_t plen, const char *resource, size_t len) {
    static const char ns[] = RL_RESERVED_PREFIX;
    if (plen + len < sizeof(ns) - 1) return 0;
    for (size_t i = 0; i < sizeof(ns) - 1; i++)
        if (key_byte(prefix, plen, resource, i) != ns[i]) return 0;
    return 1;
}

const char *rl_reserved_key(const char *prefix, size_t prefix_len, const char *resource, size_t len) {
    static const char fence[] = RL_FENCE_SUFFIX;
    size_t n = prefix_len + len, f = sizeof(fence) - 1;
    if (rl_key_in_namespace(prefix, prefix_len, resource, len))
        return "its key (prefix + resource) starts with \"" RL_RESERVED_PREFIX "\", where redlock keeps its own keys";
    if (n < f) return NULL;
    for (size_t i = 0; i < f; i++)
        if (key_byte(prefix, prefix_len, resource, n - f + i) != fence[i]) return NULL;
    return "its key (prefix + resource) ends with \"" RL_FENCE_SUFFIX "\", as a fenced lock's counter does";
}

void rl_buf_free(rl_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int rl_buf_reserve(rl_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return -1; /* no buffer could be that large */
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* Start b over with room for a command of fixed bytes plus keylen. */
static char *start(rl_buf *b, size_t fixed, size_t keylen) {
    b->len = 0;
    if (rl_buf_reserve(b, fixed + keylen + 4 * HEADER_MAX) != 0) return NULL;
    return b->data;
}

int rl_cmd_acquire(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms) {
    char *p = start(b, 64 + RL_VALUE_LEN, keylen);
    if (p == NULL) return -1;
    p = put(p, LIT("*6\r\n$3\r\nSET\r\n"));
    p = put_bulk(p, key, keylen);
    p = put(p, LIT("$40\r\n"));
    p = put(p, value, RL_VALUE_LEN);
    p = put(p, LIT("\r\n$2\r\nNX\r\n$2\r\nPX\r\n"));
    p = put_ttl(p, ttl_ms);
    b->len = (size_t)(p - b->data);
    return 0;
}

/* *argc EVALSHA sha 1 key value   or   *argc EVAL script 1 key value,
 * with room after it for two more arguments (a ttl and a short word) */
static char *script_head(rl_buf *b, char argc, int by_sha, const char *sha, const char *script,
                         size_t script_len, const char *key, size_t keylen, const char *value) {
    char *p = start(b, 64 + (by_sha ? SHA_LEN : script_len) + RL_VALUE_LEN, keylen);
    if (p == NULL) return NULL;
    *p++ = '*';
    *p++ = argc;
    if (by_sha) {
        p = put(p, LIT("\r\n$7\r\nEVALSHA\r\n$40\r\n"));
        p = put(p, sha, SHA_LEN);
        p = put(p, LIT("\r\n$1\r\n1\r\n"));
    } else {
        p = put(p, LIT("\r\n$4\r\nEVAL\r\n"));
        p = put_bulk(p, script, script_len);
        p = put(p, LIT("$1\r\n1\r\n"));
    }
    p = put_bulk(p, key, keylen);
    p = put(p, LIT("$40\r\n"));
    p = put(p, value, RL_VALUE_LEN);
    return put(p, LIT("\r\n"));
}

int rl_cmd_release(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value,
                   const char *releaser) {
    if (rl_value_shared(value)) return rl_cmd_shared_release(b, key, keylen, value, releaser == NULL);
    char *p = script_head(b, '6', by_sha, rl_release_sha, rl_release_script, sizeof(rl_release_script) - 1, key,
                          keylen, value);
    if (p == NULL) return -1;
    p = releaser ? put_bulk(p, releaser, RL_WAITER_ID_LEN) : put(p, LIT("$5\r\nquiet\r\n"));
    b->len = (size_t)(p - b->data);
    return 0;
}

int rl_cmd_extend(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value, int ttl_ms) {
    if (rl_value_shared(value)) return rl_cmd_shared_extend(b, key, keylen, value, ttl_ms);
    char *p = script_head(b, '6', by_sha, rl_extend_sha, rl_extend_script, sizeof(rl_extend_script) - 1,
                          key, keylen, value);
    if (p == NULL) return -1;
    p = put_ttl(p, ttl_ms);
    b->len = (size_t)(p - b->data);
    return 0;
}

/* EVAL script 2 key base:fence value n: a fenced lock's scripts, sent whole
 * (they run once or twice per grant, so no SCRIPT LOAD is kept for them).
 * base: the key itself on a plain node, its companion base on a cluster
 * node (rl_cluster_base). */
static int fenced_eval(rl_buf *b, const char *script, size_t script_len, const char *key, size_t keylen,
                       const char *base, size_t baselen, const char *value, unsigned long long n) {
    size_t suffix = sizeof(RL_FENCE_SUFFIX) - 1;
    char *p = start(b, 64 + script_len + suffix + RL_VALUE_LEN, keylen + baselen);
    if (p == NULL) return -1;
    p = put(p, LIT("*7\r\n$4\r\nEVAL\r\n"));
    p = put_bulk(p, script, script_len);
    p = put(p, LIT("$1\r\n2\r\n"));
    p = put_bulk(p, key, keylen);
    p = put_header(p, '$', baselen + suffix);
    p = put(p, base, baselen);
    p = put(p, LIT(RL_FENCE_SUFFIX "\r\n$40\r\n"));
    p = put(p, value, RL_VALUE_LEN);
    p = put(p, LIT("\r\n"));
    char digits[HEADER_MAX];
    p = put_bulk(p, digits, (size_t)(put_uint(digits, n) - digits));
    b->len = (size_t)(p - b->data);
    return 0;
}

int rl_cmd_acquire_queued(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms,
                          const char *waiter) {
    char *p = script_head(b, '7', 0, NULL, rl_acquire_queued_script, sizeof(rl_acquire_queued_script) - 1, key,
                          keylen, value);
    if (p == NULL) return -1;
    p = put_ttl(p, ttl_ms);
    p = put_bulk(p, waiter, RL_WAITER_ID_LEN);
    b->len = (size_t)(p - b->data);
    return 0;
}

int rl_cmd_acquire_fenced(rl_buf *b, const char *key, size_t keylen, const char *base, size_t baselen,
                          const char *value, int ttl_ms) {
    return fenced_eval(b, rl_acquire_fenced_script, sizeof(rl_acquire_fenced_script) - 1, key, keylen, base, baselen,
                       value, (unsigned long long)ttl_ms);
}

int rl_cmd_commit(rl_buf *b, const char *key, size_t keylen, const char *base, size_t baselen, const char *value,
                  long long token) {
    return fenced_eval(b, rl_commit_script, sizeof(rl_commit_script) - 1, key, keylen, base, baselen, value,
                       (unsigned long long)token);
}

/* Read the bulk string at *p (within end): its bytes and length; *p moves
 * past it. NULL if what is there is not one. */
static const char *read_bulk(const char **p, const char *end, size_t *len) {
    const char *q = *p;
    if (q >= end || *q++ != '$') return NULL;
    size_t n = 0;
    while (q < end && *q >= '0' && *q <= '9') n = n * 10 + (size_t)(*q++ - '0');
    if (end - q < 2 || q[0] != '\r' || (size_t)(end - q - 2) < n + 2) return NULL;
    const char *data = q + 2;
    *p = data + n + 2;
    *len = n;
    return data;
}

int rl_cmd_with_base(rl_buf *dst, const rl_buf *src, const char *base, size_t baselen) {
    const char *p = src->data, *end = src->data + src->len;
    dst->len = 0;
    if (src->len < 4 || p[0] != '*') return 1;
    size_t argc = 0;
    for (p++; p < end && *p >= '0' && *p <= '9'; p++) argc = argc * 10 + (size_t)(*p - '0');
    p += 2;
    size_t verb_len = 0, script_len = 0, nk_len = 0, key_len = 0;
    const char *verb = read_bulk(&p, end, &verb_len);
    const char *script = verb ? read_bulk(&p, end, &script_len) : NULL;
    const char *nk = script ? read_bulk(&p, end, &nk_len) : NULL;
    const char *key = nk ? read_bulk(&p, end, &key_len) : NULL;
    int is_eval = verb && ((verb_len == 4 && memcmp(verb, "EVAL", 4) == 0) || (verb_len == 7 && memcmp(verb, "EVALSHA", 7) == 0));
    if (!key || !is_eval || nk_len != 1 || nk[0] != '1') return 1;
    /* the extend script names no other key: it goes as it is (a base, no
     * stored key, made a slot in migration answer TRYAGAIN on both sides
     * until it ended, where the key alone runs wherever it is) */
    if ((verb_len == 7 && script_len == SHA_LEN && memcmp(script, rl_extend_sha, SHA_LEN) == 0) ||
        (verb_len == 4 && script_len == sizeof(rl_extend_script) - 1 &&
         memcmp(script, rl_extend_script, script_len) == 0))
        return 1;
    if (rl_buf_reserve(dst, src->len + baselen + 2 * HEADER_MAX) != 0) return -1;
    char *o = put_header(dst->data, '*', argc + 1);
    o = put_bulk(o, verb, verb_len);
    o = put_bulk(o, script, script_len);
    o = put(o, LIT("$1\r\n2\r\n"));
    o = put_bulk(o, key, key_len);
    o = put_bulk(o, base, baselen);
    o = put(o, p, (size_t)(end - p));
    dst->len = (size_t)(o - dst->data);
    return 0;
}

int rl_cmd_auth(rl_buf *b, const char *user, const char *password) {
    if (password[0] == '\0') return 0;
    const char *argv[3] = {"AUTH"};
    size_t lens[3] = {4};
    int argc = 1;
    if (user[0]) argv[argc] = user, lens[argc++] = strlen(user);
    argv[argc] = password, lens[argc++] = strlen(password);
    return rl_cmd_append_argv(b, argc, argv, lens) == 0 ? 1 : -1;
}

int rl_cmd_append_argv(rl_buf *b, int argc, const char *const *argv, const size_t *lens) {
    size_t need = HEADER_MAX;
    for (int i = 0; i < argc; i++) need += lens[i] + HEADER_MAX;
    if (rl_buf_reserve(b, need) != 0) return -1;
    char *p = put_header(b->data + b->len, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) p = put_bulk(p, argv[i], lens[i]);
    b->len = (size_t)(p - b->data);
    return 0;
}
