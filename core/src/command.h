/* command.h — the RESP bytes of every command a round sends, encoded once per round. */
#ifndef RL_COMMAND_H
#define RL_COMMAND_H

#include <stddef.h>

/* A growable byte buffer, reused across rounds (it only ever grows). */
typedef struct rl_buf {
    char *data;
    size_t len, cap;
} rl_buf;

/* Make room for extra more bytes after the content. Return 0, or -1 when out of memory. */
int rl_buf_reserve(rl_buf *b, size_t extra);

void rl_buf_free(rl_buf *b);

/* The compare-and-delete and compare-and-pexpire scripts, shared with other
 * Redlock clients, and their SHA1 digests (checked against Redis by a spec). */
extern const char rl_release_script[];
extern const char rl_extend_script[];
extern const char rl_release_sha[];
extern const char rl_extend_sha[];

/* The namespace of our own keys and channels: no lock's key starts with it
 * (rl_reserved_key), so none is one of ours. */
#define RL_RESERVED_PREFIX "redlock:"

/* Hand-off's queue of waiters (a list of waiter ids) for a key, and the
 * channel that wakes one of them: prefix .. key, and prefix .. id .. ":" .. key. */
#define RL_QUEUE_PREFIX "redlock:queue:"
#define RL_WAKE_PREFIX "redlock:wake:"

/* A woken waiter's turn over the releaser (docs/waiting.md, "Whose turn
 * it is"): RL_TURN_PREFIX .. base holds "<woken> <releaser>", the ids of
 * the queued waiter a release woke and of the releasing client, for
 * RL_TURN_MS or until the waiter woken attempts. Meanwhile the releasing
 * client's waiter attempts are refused, the lock free or not: one sent
 * right behind the release (the client's next waiter, handed the lock in
 * the same process) would otherwise take it before the waiter woken could
 * ask. Nobody else is refused for it: queues of different nodes may
 * disagree on who was first, and a turn that bound every waiter would
 * split the votes among them. Short: the attempt it is for goes right
 * behind the release; and a waiter woken that does not ask (stopped), or
 * a client older than turns, which takes the lock without ending them,
 * holds the releaser back for no longer. */
#define RL_TURN_PREFIX "redlock:turn:"
#define RL_TURN_MS 100

/* Lua: is this node a cluster node? INFO's cluster section says, without
 * an error on a plain node (an error reply would count in its errorstats);
 * a user INFO is denied to is taken as on a plain node. For the scripts
 * whose commands cannot carry the answer (a semaphore's). */
#define RL_IN_CLUSTER                                                                                    \
    "local function in_cluster() local i = redis.pcall(\"info\",\"cluster\") "                             \
    "return type(i) == \"string\" and string.find(i, \"cluster_enabled:1\", 1, true) ~= nil end "

/* The base of KEYS[1]'s companion names, in Lua: local B, PUB, NUM. A
 * command for a plain node has one key: B is the key itself, and waiters
 * are told with PUBLISH. The engine sends a cluster node the same command
 * with the key's companion base (hashslot.h) as a second key
 * (rl_cmd_with_base): every companion name is then in the key's slot, and
 * waiters are told with SPUBLISH on the shard that serves it (no broadcast
 * over the cluster's bus). */
#define RL_BASE                                                                                          \
    "local B, PUB, NUM = KEYS[1], \"publish\", \"numsub\" "                                               \
    "if #KEYS > 1 then B, PUB, NUM = KEYS[#KEYS], \"spublish\", \"shardnumsub\" end "

/* What a release that emptied the key runs to wake waiters (Lua, the tail
 * of a script whose KEYS[1] is the key; see rl_release_script): the first
 * queued waiter still listening, else a broadcast; it returns 2 if it
 * published, else 1. R: a Lua expression, the releasing client's waiter
 * id, or nil: a waiter of another client woken has its turn over it
 * (RL_TURN_PREFIX). Names and publishing as RL_BASE says. */
#define RL_WAKE_WAITERS(R)                                                                           \
    RL_BASE "local q, R = \"" RL_QUEUE_PREFIX "\"..B, " R " "                                           \
    "for i = 1, 8 do local w = redis.pcall(\"lpop\",q) if type(w) ~= \"string\" then break end "       \
    "local s = redis.pcall(PUB,\"" RL_WAKE_PREFIX "\"..w..\":\"..B,1) "                                \
    "if type(s) == \"number\" and s > 0 then if R and R ~= w then "                                  \
    "redis.pcall(\"set\",\"" RL_TURN_PREFIX "\"..B,w..\" \"..R,\"PX\"," STR(RL_TURN_MS) ") end return 2 end end " \
    "local c = \"redlock:released:\"..B local s = redis.pcall(\"pubsub\",NUM,c) "                    \
    "local k = type(s) == \"table\" and tonumber(s[2]) or 0 "                                        \
    "if k > 0 and type(redis.pcall(PUB,c,k)) == \"number\" then return 2 end return 1 "

/* A semaphore waiter's ticket (ms, rl_wall_ms() when its wait began) is
 * below this: the nodes score their queues by it in whole µs, which a
 * double keeps exact up to 2^53. */
#define RL_TICKET_MAX_MS 9e12

/* The most waiters a queue takes: a refused attempt finds its place in at
 * most this many entries. */
#define RL_QUEUE_MAX 1024

/* A waiter's acquire: SET NX PX, and the queue of waiters joined on refusal
 * (left on a grant); answered like SET. Sent whole (EVAL), like the fenced scripts. */
extern const char rl_acquire_queued_script[];

/* A fenced lock's counter: the lock's key with this appended (no lock's key
 * ends with it: rl_reserved_key). */
#define RL_FENCE_SUFFIX ":fence"

/* A fenced lock's two rounds (docs/design.md, "Fencing tokens"): SET NX PX and,
 * if set, INCR of the counter, returning it as a bulk string of decimal
 * digits (else nil); and the commit: if the key still holds our value, raise
 * the counter to the token (1), else 0. Both answer an error reply, having
 * written nothing, when the counter is not a positive integer (another type,
 * or a string INCR would not count from) and the acquire when it is at
 * 2^63-1, the end of INCR's range; the error names the counter key. */
extern const char rl_acquire_fenced_script[];
extern const char rl_commit_script[];

/* s[0..len), a fence counter's whole text, as a fencing token, by the rule
 * the scripts' check applies on the nodes: 1 to 19 decimal digits without a
 * sign or a leading zero, at most 2^63-1 (the end of INCR's range). Return
 * 1 and set *token; 0 when it is no token. Exact at any value: no double on
 * the way. The engine reads a fenced grant's reply with it, `redlock
 * status` the counters it finds. */
int rl_fence_token(const char *s, size_t len, long long *token);

/* A semaphore (docs/design.md, "Semaphores"; command_slots.c): limit slots,
 * slot k an ordinary lock on the key RL_SLOT_PREFIX .. k .. ":" .. key (key =
 * prefix .. resource), inside the reserved namespace, so no lock's key is
 * one. Its waiters queue in RL_SEM_QUEUE_PREFIX .. key (a sorted set: waiter
 * ids by ticket); RL_LIMIT_PREFIX .. key holds the limit its waiters last
 * asked with (for the releases to count free slots); RL_KEPT_PREFIX .. key
 * when each waiter a free slot is kept for was first found kept (a hash:
 * waiter id -> the node's time, ms). A waiter kept for longer than
 * RL_SEM_KEEP_MS without taking its slot (stopped, hung, cut off with its
 * connection still open) loses its place to the callers behind it. */
#define RL_SLOT_PREFIX "redlock:slot:"
#define RL_SEM_QUEUE_PREFIX "redlock:squeue:"
#define RL_LIMIT_PREFIX "redlock:limit:"
#define RL_KEPT_PREFIX "redlock:kept:"
#define RL_SEM_KEEP_MS 1000
/* A waiter that moves up to a turn because one ahead of it was dropped for
 * having been kept too long is kept this long, not RL_SEM_KEEP_MS: it was
 * woken on the spot, and a live one asks within a round trip. So a line of
 * k stopped waiters keeps a free slot idle for RL_SEM_KEEP_MS + (k - 1) x
 * RL_SEM_MOVED_UP_MS (and the time until someone asks after each), not k
 * seconds. */
#define RL_SEM_MOVED_UP_MS 250
extern const char rl_acquire_slot_script[];
extern const char rl_acquire_slot_sha[];
extern const char rl_release_slot_script[];
extern const char rl_release_slot_sha[];
extern const char rl_release_slots_script[];

/* b = slot's key for key (replacing b's content). The one function that
 * names slots' keys. Return 0, or -1 when out of memory. */
int rl_slot_key(rl_buf *b, const char *key, size_t keylen, int slot);

/* The length of what rl_slot_key puts before key for slot: a slot's key
 * with that much skipped is the semaphore's key. */
size_t rl_slot_head_len(int slot);

/* Encode into b, as below; 0, or -1 when out of memory.
 *   acquire_slot:  EVALSHA acquire_slot_sha L+1 slotkey(order[0]) .. slotkey(order[L-1]) key
 *                  value ttl waiter-or-"" ticket order[0] .. order[L-1] (by_sha = 0: EVAL script
 *                  ...; a reply: the slot taken, or nil); ticket: the waiter's place (wall-clock
 *                  ms), sent as whole µs (0 without waiter)
 *   release_slot:  EVALSHA release_slot_sha 2 key sem value [quiet] (by_sha = 0: EVAL script ...):
 *                  the release of a slot's key, waking the waiter of the semaphore sem whose turn
 *                  it is (answers as a release)
 *   release_slots: EVAL release_slots_script n keys.. value how waiter-or-"" key limit ticket: slot
 *                  only's key (only > 0), none (only < 0), or every slot's key from 1 to limit but
 *                  except's; how "" (no waiter), "back" (a waiter's failed acquire: queued again) or
 *                  "leave" (a waiter's won acquire: it leaves the queue) */
int rl_cmd_acquire_slot(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value, int ttl_ms,
                        const char *waiter, double ticket, const int *order, int limit);
int rl_cmd_release_slot(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *sem, size_t semlen,
                        const char *value, int quiet);
int rl_cmd_release_slots(rl_buf *b, const char *key, size_t keylen, const char *value, int limit, int only,
                         int except, const char *waiter, double ticket, const char *how);

/* 1 if prefix .. resource starts with RL_RESERVED_PREFIX, else 0. */
int rl_key_in_namespace(const char *prefix, size_t plen, const char *resource, size_t len);

/* Encode into b (replacing its content); each returns 0, or -1 when out of memory.
 *   acquire: SET key value NX PX ttl
 *   release: EVALSHA release_sha 1 key value releaser  (by_sha = 0: EVAL script ...)
 *   extend:  EVALSHA extend_sha 1 key value ttl        (by_sha = 0: EVAL script ...) */
int rl_cmd_acquire(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms);
/*   queued:  EVAL script 1 key value ttl waiter   (waiter: RL_WAITER_ID_LEN characters) */
int rl_cmd_acquire_queued(rl_buf *b, const char *key, size_t keylen, const char *value, int ttl_ms,
                          const char *waiter);
/*   releaser: the releasing client's waiter id (RL_WAITER_ID_LEN characters), ARGV[2], which
 *   a waiter woken gets its turn over (RL_TURN_PREFIX); NULL (a failed acquire's cleanup, a
 *   quiet release): ARGV[2] "quiet", and the release wakes nobody */
int rl_cmd_release(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value,
                   const char *releaser);
int rl_cmd_extend(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value, int ttl_ms);

/* Encode into b, as above:
 *   acquire_fenced: EVAL acquire_fenced_script 2 key base:fence value ttl
 *   commit:         EVAL commit_script 2 key base:fence value token (token >= 1)
 * base: key on a plain node; on a cluster node its companion base
 * (rl_cluster_base), so that the counter is in the key's slot. */
int rl_cmd_acquire_fenced(rl_buf *b, const char *key, size_t keylen, const char *base, size_t baselen,
                          const char *value, int ttl_ms);
int rl_cmd_commit(rl_buf *b, const char *key, size_t keylen, const char *base, size_t baselen, const char *value,
                  long long token);

/* Write into dst the command src (an EVAL or EVALSHA of one key, as the
 * scripts that start with RL_BASE are sent) with base as a second key: the
 * form a cluster node gets. 0, 1 when src is not such a command, or is the
 * extend script, which names no other key (dst is then empty: src goes as
 * it is), or -1 when out of memory. */
int rl_cmd_with_base(rl_buf *dst, const rl_buf *src, const char *base, size_t baselen);

/* Append AUTH [user] password to b, after its content, if password is not
 * empty (user "" sends the password alone). Return 1 if appended, 0 if
 * there is no password, -1 when out of memory. */
int rl_cmd_auth(rl_buf *b, const char *user, const char *password);

/* Append any command (argc words) to b, after its content. Return 0, or -1 when out of memory. */
int rl_cmd_append_argv(rl_buf *b, int argc, const char *const *argv, const size_t *lens);

#endif
