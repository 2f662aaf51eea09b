/* shared.h — shared (read) holds: their scripts, their values, and the
 * writer's intent mark (docs/design.md, "Shared holds").
 *
 * On each node, for a lock's key K:
 *   - K itself: a writer's value while a writer holds it, or RL_SHARED_MARK
 *     while readers do, expiring with the last of them; so SET NX (and every
 *     script that takes K) refuses a writer while a reader holds, ours or
 *     any other Redlock client's;
 *   - RL_READERS_PREFIX .. K: a sorted set of the readers' values, each
 *     scored with its expiry on the node's clock (TIME, in ms), pruned of the
 *     expired by every script that reads it, and expiring with its last;
 *   - RL_INTENT_PREFIX .. K: a waiting writer's mark (Writer priority).
 * A reader's value is a lock value whose last character is RL_SHARED_CHAR
 * (never hex; a holder label, if any, comes first): the release and extend of a value say by themselves which
 * scripts they run, so a failed acquire's cleanup, keep-alive, the hub's
 * release of an orphaned grant and dlm:adopt need nothing more.
 *
 * Writer priority: a writer that waits (its queued attempts, see
 * rl_acquire_queued_script) and finds readers in sets the intent mark for
 * its ttl; a shared acquire is refused while the mark stands; the writer's
 * grant deletes it. A mark left by a writer that gave up ends with its ttl. */
#ifndef RL_SHARED_H
#define RL_SHARED_H

#include <stddef.h>

#include "command.h"
#include "redlock.h"

#define RL_SHARED_MARK "redlock:shared"
#define RL_READERS_PREFIX "redlock:readers:"
#define RL_INTENT_PREFIX "redlock:writer-intent:"
#define RL_SHARED_CHAR 's'

/* The queued acquire's part in writer priority (Lua, in its script, after
 * RL_BASE: the mark is named with the key's base B): on a grant, the mark
 * goes; on a refusal while readers hold, it is set. */
#define RL_INTENT_GRANTED "redis.pcall(\"del\",\"" RL_INTENT_PREFIX "\"..B) "
#define RL_INTENT_REFUSED                                                                       \
    "if redis.pcall(\"get\",KEYS[1]) == \"" RL_SHARED_MARK "\" then "                           \
    "redis.pcall(\"set\",\"" RL_INTENT_PREFIX "\"..B,ARGV[3],\"PX\",ARGV[2]) end "

/* The scripts (EVAL script 1 key value ttl|word):
 *   acquire: refused (nil) while a writer holds K or a writer's mark stands;
 *            else the reader is added, K and the set cover it: status OK;
 *   extend:  1 if value is a live reader (it now expires ttl from now), else 0;
 *   release: 0 if value is not a live reader; else it leaves, and the last
 *            reader to leave deletes K and wakes waiters as a release does
 *            (unless ARGV[2] is "quiet"): 1, or 2 if it published. */
extern const char rl_shared_acquire_script[];
extern const char rl_shared_extend_script[];
extern const char rl_shared_release_script[];

/* 1 if value (RL_VALUE_LEN characters) is a reader's, else 0. */
static inline int rl_value_shared(const char *value) {
    return value[RL_VALUE_LEN - 1] == RL_SHARED_CHAR;
}

/* Make a fresh lock value (rl_value_generate_labelled) a reader's. */
static inline void rl_value_make_shared(char *value) {
    value[RL_VALUE_LEN - 1] = RL_SHARED_CHAR;
}

/* Encode into b (replacing its content), always as EVAL: no script of these
 * is loaded on a node. Return 0, or -1 when out of memory. */
int rl_cmd_shared_acquire(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms);
int rl_cmd_shared_extend(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms);
int rl_cmd_shared_release(rl_buf *b, const char *key, size_t keylen, const char *value, int quiet);

#endif
