/* shared.c — the scripts of shared (read) holds and their encoding (see
 * shared.h). */
#include "shared.h"

#include "redlock.h"
#include "resp.h"

/* Every script starts here: the key's base B (RL_BASE: the key itself on
 * a plain node, in its slot on a cluster node), the key, the readers' set, the node's time in
 * ms, and cover(): drop the expired readers, then make K (the mark) and the
 * set last exactly as long as the last reader left, or delete the mark if
 * none is; the readers left (a K holding a writer's value is never
 * touched). Numbers go to Redis as whole decimal strings (%.0f). */
#define SHARED_PRELUDE                                                                                   \
    RL_BASE                                                                                              \
    "local key, rd, mark = KEYS[1], \"" RL_READERS_PREFIX "\"..B, \"" RL_SHARED_MARK "\" "               \
    "local t = redis.call(\"time\") local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) " \
    "local function num(x) return string.format(\"%.0f\", x) end "                                      \
    "local function cover() redis.call(\"zremrangebyscore\",rd,\"-inf\",num(now)) "                     \
    "local top = redis.call(\"zrange\",rd,-1,-1,\"withscores\") local held = redis.call(\"get\",key) "    \
    "if #top == 0 then if held == mark then redis.call(\"del\",key) end return 0 end "                   \
    "if held and held ~= mark then return redis.call(\"zcard\",rd) end "                                                 \
    "local ms = num(tonumber(top[2]) - now) "                                                            \
    "redis.call(\"set\",key,mark,\"PX\",ms) redis.call(\"pexpire\",rd,ms) return redis.call(\"zcard\",rd) end "

const char rl_shared_acquire_script[] =
    SHARED_PRELUDE
    "local held = redis.call(\"get\",key) if held and held ~= mark then return false end "
    "if redis.call(\"exists\",\"" RL_INTENT_PREFIX "\"..B) == 1 then return false end "
    "redis.call(\"zadd\",rd,num(now + tonumber(ARGV[2])),ARGV[1]) cover() "
    "return redis.status_reply(\"OK\")";

const char rl_shared_extend_script[] =
    SHARED_PRELUDE
    "if redis.call(\"get\",key) ~= mark then return 0 end "
    "local s = redis.call(\"zscore\",rd,ARGV[1]) if not s or tonumber(s) <= now then return 0 end "
    "redis.call(\"zadd\",rd,num(now + tonumber(ARGV[2])),ARGV[1]) cover() return 1";

const char rl_shared_release_script[] =
    SHARED_PRELUDE
    "local s = redis.call(\"zscore\",rd,ARGV[1]) if not s then return 0 end "
    "local live = tonumber(s) > now and redis.call(\"get\",key) == mark "
    "redis.call(\"zrem\",rd,ARGV[1]) "
    "if cover() > 0 or not live then return live and 1 or 0 end "
    "if ARGV[2] == \"quiet\" then return 1 end " RL_WAKE_WAITERS("nil");

#define LIT(s) s, sizeof(s) - 1

/* v in decimal into digits (room for 20); its length. */
static size_t decimal(char *digits, unsigned long long v) {
    char rev[20];
    size_t n = 0, k = 0;
    do rev[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n > 0) digits[k++] = rev[--n];
    return k;
}

/* EVAL script 1 key value word (the ttl, or a release's "quiet"/""). */
static int shared_eval(rl_buf *b, const char *script, size_t script_len, const char *key, size_t keylen,
                       const char *value, const char *word, size_t word_len) {
    const char *argv[6] = {"EVAL", script, "1", key, value, word};
    size_t lens[6] = {4, script_len, 1, keylen, RL_VALUE_LEN, word_len};
    b->len = 0;
    return rl_cmd_append_argv(b, 6, argv, lens);
}

int rl_cmd_shared_acquire(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms) {
    char ttl[20];
    return shared_eval(b, LIT(rl_shared_acquire_script), key, keylen, value, ttl,
                       decimal(ttl, (unsigned long long)ttl_ms));
}

int rl_cmd_shared_extend(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms) {
    char ttl[20];
    return shared_eval(b, LIT(rl_shared_extend_script), key, keylen, value, ttl,
                       decimal(ttl, (unsigned long long)ttl_ms));
}

int rl_cmd_shared_release(rl_buf *b, const char *key, size_t keylen, const char *value, int quiet) {
    return quiet ? shared_eval(b, LIT(rl_shared_release_script), key, keylen, value, LIT("quiet"))
                 : shared_eval(b, LIT(rl_shared_release_script), key, keylen, value, LIT("wake"));
}
