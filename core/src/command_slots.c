/* command_slots.c — a semaphore's commands (docs/design.md, "Semaphores"):
 * the names of its slots' keys, the scripts that take a slot, release one
 * and undo an acquire, and their RESP encoding. The acquire and the release
 * go by SHA1 (EVALSHA, then EVAL where a node answers NOSCRIPT); the undo,
 * rarer, goes whole (EVAL).
 *
 * The order of waiters. Each node keeps the semaphore's queue of waiters
 * (RL_SEM_QUEUE_PREFIX .. key): a sorted set of waiter ids, each scored by
 * its ticket, the wall-clock time (µs) of its first refused attempt, which
 * the same command carries to every node, so the nodes' queues agree. With
 * F slots free on a node, the first F waiters of its queue are the ones
 * whose turn it is: the node gives a free slot only to one of them, or to a
 * caller outside the queue when more than its length are free. The waiter
 * at place r (from 0) gets the (r+1)-th free slot by number, so that nodes
 * whose queues agree give each waiter the same slot, and two waiters never
 * split the nodes' votes over one slot. A release, or an undone acquire,
 * wakes the waiters at places 0 to F-1: the one whose turn has just come,
 * and any woken before whose attempt failed, which still wait at theirs.
 * None of this bears on "never more than L": each node still SETs at most
 * one slot NX per acquire; it only refuses callers a plain SET NX would
 * have let in. */
#include <stdint.h>
#include <string.h>

#include "command.h"
#include "redlock.h"
#include "resp.h"

#define RL_RELEASED_PREFIX "redlock:released:"

/* How a semaphore's scripts tell waiters, in Lua: pub() answers the
 * publishing command and the pubsub subcommand that counts listeners:
 * PUBLISH and NUMSUB on a plain node, SPUBLISH and SHARDNUMSUB on a cluster
 * node (RL_IN_CLUSTER, asked once per run and only when needed), whose
 * names the engine made in the key's slot already: the semaphore's key the
 * scripts get is its base there (hashslot.h). */
#define RL_PUBLISHING \
    RL_IN_CLUSTER "local PUB, NUM " \
    "local function pub() if not PUB then PUB, NUM = \"publish\", \"numsub\" " \
    "if in_cluster() then PUB, NUM = \"spublish\", \"shardnumsub\" end end return PUB, NUM end "

/* turn(k, l, q): wake the waiters of queue q (of the semaphore key k, limit
 * l, or nil when unknown: one slot free is assumed) whose turn it is: with
 * f slots free, those at places 0 to f-1. Not only the one whose turn has
 * just come: one woken before whose attempt failed (the nodes were not yet
 * of one mind) is still at its place with its slot kept free for it, and
 * would otherwise wait for its policy's next attempt. One that no longer
 * listens is dropped and the next one moves up, and so is one whose turn
 * came more than RL_SEM_KEEP_MS ago by the node's clock (stopped, hung, or
 * cut off: releases of the other slots, taken by those behind it, would
 * otherwise never find it out); 8 looked at, at most. With fewer than f
 * queued, every listener on the broadcast channel hears the release, as
 * for a lock. A waiter woken is marked kept (RL_KEPT_PREFIX) from now, by
 * the node's clock, unless it is marked already: its RL_SEM_KEEP_MS to
 * come count from its first turn (so does the first caller behind it that
 * asks after that drop it, whatever its policy's delay); one dropped loses
 * its mark. One that moves up because a waiter kept too long was dropped
 * in this pass is kept RL_SEM_MOVED_UP_MS only (a line of stopped waiters
 * would otherwise keep the slot idle a second each). Answers 2 when
 * someone heard it, else 1. */
#define RL_SLOT_TURN \
    RL_PUBLISHING \
    "local function turn(k, l, q) " \
    "local f = 1 " \
    "if l then local names = {} for s = 1, l do names[s] = \"" RL_SLOT_PREFIX "\"..s..\":\"..k end " \
    "f = l - redis.call(\"exists\",unpack(names)) end " \
    "local n = redis.pcall(\"zcard\",q) " \
    "if f > 0 and type(n) == \"number\" and n <= " STR(RL_QUEUE_MAX) " then " \
    "local i, sent, woke, K, now, late = 0, 0, 0, \"" RL_KEPT_PREFIX "\"..k " \
    "while i < f and f <= n and sent < 8 do " \
    "local e = redis.pcall(\"zrange\",q,i,i) e = type(e) == \"table\" and e[1] if type(e) ~= \"string\" then break end " \
    "sent = sent + 1 " \
    "if not now then local tm = redis.call(\"time\") now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000) end " \
    "local t = tonumber(redis.pcall(\"hget\",K,e)) " \
    "local s = (not t or now - t <= " STR(RL_SEM_KEEP_MS) ") and redis.pcall((pub()),\"" RL_WAKE_PREFIX "\"..e..\":\"..k,1) " \
    "if type(s) == \"number\" and s > 0 then woke, i = woke + 1, i + 1 " \
    "if not t then redis.pcall(\"hset\",K,e,late and now - (" STR(RL_SEM_KEEP_MS - RL_SEM_MOVED_UP_MS) ") or now) end " \
    "else if t and s == false then late = true end " \
    "redis.pcall(\"zrem\",q,e) redis.pcall(\"hdel\",K,e) n = n - 1 end end " \
    "if woke > 0 then redis.pcall(\"pexpire\",K,60000) return 2 end " \
    "end " \
    "if f == 0 then return 1 end " \
    "local c = \"" RL_RELEASED_PREFIX "\"..k local s = redis.pcall(\"pubsub\",select(2, pub()),c) " \
    "local m = type(s) == \"table\" and tonumber(s[2]) or 0 " \
    "if m > 0 and type(redis.pcall((pub()),c,m)) == \"number\" then return 2 end return 1 end "

/* KEYS[1..L]: the slots' keys in the order the client drew, KEYS[L+1] the
 * semaphore's key (never written: it names the queue); ARGV[1] the value,
 * ARGV[2] the ttl, ARGV[3] a waiter id or "" (no queue), ARGV[4] the
 * waiter's ticket, ARGV[4+i] the number of KEYS[i]. The slot taken is
 * answered, or nil. A waiter's place is its rank in the queue, or, not in
 * it, the number of tickets before its own; a caller without a waiter id
 * comes after the whole queue. With nobody queued, a waiter takes the first
 * free slot in its order, as any caller (two waiters with nobody ahead would
 * otherwise both aim at the lowest free slot and split its votes). When the free slots are all kept for waiters
 * ahead, the first waiters that no longer listen are dropped, until as many
 * that listen as slots free are found (16 looked at, at most: a queue of
 * dead waiters drains 16 at a time, not one); so is one that still listens
 * but was first found kept more than RL_SEM_KEEP_MS ago by the node's clock
 * (stopped, hung, or cut off with its connection open: it would keep the
 * slot idle until its connection dies; one found kept for the first time
 * after such a drop in the same pass is kept RL_SEM_MOVED_UP_MS only, not
 * a second more). Found so by a caller that asks
 * again (a waiter in the queue already) or has no queue (try_lock): a
 * waiter's first refusal, the commonest (the sem benchmark's releaser that
 * asks again at once), neither marks nor drops: marking on every refusal
 * cost that benchmark 10-11 % more node CPU per acquisition, this 1-3 %
 * (bench/ab, 6 rounds each, within the noise). One dropped that is alive
 * after all joins again at its place (its ticket) when it next asks. After
 * a drop, the waiters now found at those places are woken: it is their
 * turn. A waiter takes the free slot of its place (and its mark of being
 * kept goes); a caller without one, of those not kept, the first in its
 * order. A refused waiter joins the
 * queue with its ticket (a waiter in it keeps its place) and leaves the
 * limit (RL_LIMIT_PREFIX .. key) for releases to count free slots with. A
 * queue of another type, or of more than RL_QUEUE_MAX entries (only others'
 * writes make one), is ignored: nobody waits in it. Sent by its SHA1
 * (rl_acquire_slot_sha; every connection's setup loads it): a node that
 * lost it answers NOSCRIPT, and the acquire goes there again as EVAL while
 * its round is open (ops.c). Sent whole every time, its SHA1 was the
 * nodes' largest single cost in the sem benchmark. */
const char rl_acquire_slot_script[] =
    RL_PUBLISHING
    "local l = #KEYS - 1 local k, w = KEYS[l + 1], ARGV[3] local q = \"" RL_SEM_QUEUE_PREFIX "\"..k "
    "local K = \"" RL_KEPT_PREFIX "\"..k "
    "local at, free = {}, {} "
    "for i = 1, l do at[tonumber(ARGV[4 + i])] = i end "
    "local held = redis.call(\"mget\",unpack(KEYS, 1, l)) "
    "for s = 1, l do local i = at[s] if i and not held[i] then free[#free + 1] = i end end "
    "local n, r, queued, inq "
    "local function place() "
    "n = redis.pcall(\"zcard\",q) if type(n) ~= \"number\" or n > " STR(RL_QUEUE_MAX) " then n = nil end "
    "r, queued = 0, w ~= \"\" "
    "if not n or n == 0 then return end "
    "if w == \"\" then r = n return end "
    "r = redis.pcall(\"zrank\",q,w) inq = type(r) == \"number\" "
    "if type(r) ~= \"number\" then r = redis.pcall(\"zcount\",q,\"-inf\",\"(\"..ARGV[4]) end "
    "if type(r) ~= \"number\" then r = n end "
    "end "
    "place() "
    "if #free > 0 and r >= #free then "
    "local i, live, looked, dropped, kept, late = 0, 0, 0, 0, {} "
    "local tm, now = (w == \"\" or inq) and redis.pcall(\"time\") "
    "if type(tm) == \"table\" then now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000) end "
    "while live < #free and looked < 16 do "
    "local e = redis.pcall(\"zrange\",q,i,i) e = type(e) == \"table\" and e[1] if type(e) ~= \"string\" then break end "
    "looked = looked + 1 "
    "local s = redis.pcall(\"pubsub\",select(2, pub()),\"" RL_WAKE_PREFIX "\"..e..\":\"..k) "
    "local gone = type(s) == \"table\" and s[2] == 0 "
    "if not gone and now then local t = tonumber(redis.pcall(\"hget\",K,e)) "
    "if not t then redis.pcall(\"hset\",K,e,late and now - (" STR(RL_SEM_KEEP_MS - RL_SEM_MOVED_UP_MS) ") or now) "
    "redis.pcall(\"pexpire\",K,60000) "
    "elseif now - t > " STR(RL_SEM_KEEP_MS) " then gone, late = true, true end end "
    "if gone then redis.pcall(\"zrem\",q,e) redis.pcall(\"hdel\",K,e) dropped = dropped + 1 "
    "else live, i, kept[#kept + 1] = live + 1, i + 1, e end end "
    "if dropped > 0 then "
    "for _, e in ipairs(kept) do if e ~= w then redis.pcall((pub()),\"" RL_WAKE_PREFIX "\"..e..\":\"..k,1) end end "
    "place() end "
    "end "
    "if r < #free then "
    "local i = free[r + 1] "
    "if not queued or not n or n == 0 then for j = r + 2, #free do if free[j] < i then i = free[j] end end end "
    "if not redis.call(\"set\",KEYS[i],ARGV[1],\"NX\",\"PX\",ARGV[2]) then return false end "
    "if queued and n and n > 0 then redis.pcall(\"zrem\",q,w) redis.pcall(\"hdel\",K,w) end "
    "return tonumber(ARGV[4 + i]) "
    "end "
    "if w == \"\" or not n or n >= " STR(RL_QUEUE_MAX) " then return false end "
    "redis.pcall(\"zadd\",q,\"NX\",ARGV[4],w) redis.pcall(\"pexpire\",q,60000) redis.pcall(\"set\",\"" RL_LIMIT_PREFIX "\"..k,l,\"PX\",60000) "
    "return false";

/* KEYS[1] a slot's key, KEYS[2] the semaphore's; ARGV[1] the value,
 * ARGV[2] "quiet" or absent. Compare and delete; then (not quiet) turn(),
 * with the limit the waiters left (none: one slot free assumed). Answers 0
 * not ours, 1 deleted, 2 deleted and a waiter heard it. Sent by its SHA1
 * (rl_release_slot_sha): a node that does not know it answers NOSCRIPT, and
 * the release goes again as EVAL, which teaches the node the script. */
const char rl_release_slot_script[] =
    RL_SLOT_TURN
    "if redis.call(\"get\",KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call(\"del\",KEYS[1]) "
    "if ARGV[2] == \"quiet\" then return 1 end "
    "local k = KEYS[2] local l = redis.pcall(\"get\",\"" RL_LIMIT_PREFIX "\"..k) "
    "l = type(l) == \"string\" and string.match(l,\"^[1-9]%d?%d?%d?$\") and tonumber(l) or nil "
    "if l and l > " STR(RL_MAX_LIMIT) " then l = nil end "
    "return turn(k, l, \"" RL_SEM_QUEUE_PREFIX "\"..k)";

/* Undo a semaphore's acquire on one node. KEYS: slots' keys (maybe none);
 * ARGV[1] the value, ARGV[2] how ("", "back", "leave"), ARGV[3] the waiter
 * id or "", ARGV[4] the semaphore's key, ARGV[5] its limit, ARGV[6] the
 * waiter's ticket. Each of KEYS holding the value is deleted. "back" (a
 * waiter's failed acquire): a waiter whose slot was deleted here is queued
 * again with its ticket, at its place (and the limit left again for
 * releases, as a refused waiter leaves it). "leave" (a waiter's won
 * acquire, on a node whose vote went elsewhere): the waiter leaves the
 * queue, and nobody is woken (what it undid here was free here before it
 * asked; waking whose turn that makes cost the sem benchmark a tenth of
 * its rate in wake-ups that found no quorum). Else turn() when a slot was
 * deleted: it is free again here. Answers 1 or 2, as a release does. */
const char rl_release_slots_script[] =
    RL_SLOT_TURN
    "local undone = 0 "
    "for i = 1, #KEYS do if redis.call(\"get\",KEYS[i]) == ARGV[1] then redis.call(\"del\",KEYS[i]) undone = undone + 1 end end "
    "local how, w, k, l = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]) "
    "local q = \"" RL_SEM_QUEUE_PREFIX "\"..k "
    "local n = redis.pcall(\"zcard\",q) "
    "if type(n) ~= \"number\" or n > " STR(RL_QUEUE_MAX) " then n = nil end "
    "if how == \"leave\" then if n and n > 0 then redis.pcall(\"zrem\",q,w) redis.pcall(\"hdel\",\"" RL_KEPT_PREFIX "\"..k,w) end "
    "return 1 end "
    "if how == \"back\" and undone > 0 and n and n < " STR(RL_QUEUE_MAX) " then "
    "redis.pcall(\"zadd\",q,\"NX\",ARGV[6],w) redis.pcall(\"pexpire\",q,60000) "
    "if l then redis.pcall(\"set\",\"" RL_LIMIT_PREFIX "\"..k,l,\"PX\",60000) end end "
    "if undone == 0 then return 1 end "
    "return turn(k, l, q)";

/* "redlock:slot:<slot>:" into out (room for 32 bytes); its length. The one
 * place where a slot's key name is made: its key is this .. prefix .. resource. */
static size_t slot_head(char *out, int slot) {
    char *p = put(out, LIT(RL_SLOT_PREFIX));
    p = put_uint(p, (unsigned)slot);
    *p++ = ':';
    return (size_t)(p - out);
}

size_t rl_slot_head_len(int slot) {
    char head[32];
    return slot_head(head, slot);
}

int rl_slot_key(rl_buf *b, const char *key, size_t keylen, int slot) {
    char head[32];
    size_t h = slot_head(head, slot);
    b->len = 0;
    if (rl_buf_reserve(b, h + keylen) != 0) return -1;
    memcpy(b->data, head, h);
    memcpy(b->data + h, key, keylen);
    b->len = h + keylen;
    return 0;
}

/* slot's key (slot_head .. key) as a bulk string */
static char *put_slot_key(char *p, int slot, const char *key, size_t keylen) {
    char head[32];
    size_t h = slot_head(head, slot);
    p = put_header(p, '$', h + keylen);
    p = put(p, head, h);
    p = put(p, key, keylen);
    return put(p, LIT("\r\n"));
}

/* *argc EVAL script numkeys (or, sha not NULL, *argc EVALSHA sha numkeys):
 * the head of a command with numkeys keys and argc words in all, with room
 * for extra more bytes after it. */
static char *eval_head(rl_buf *b, size_t argc, const char *sha, const char *script, size_t script_len,
                       size_t numkeys, size_t extra) {
    b->len = 0;
    if (extra > SIZE_MAX / 4 || rl_buf_reserve(b, 4 * HEADER_MAX + script_len + extra) != 0) return NULL;
    char *p = put_header(b->data, '*', argc);
    if (sha) {
        p = put(p, LIT("$7\r\nEVALSHA\r\n"));
        p = put_bulk(p, sha, SHA_LEN);
    } else {
        p = put(p, LIT("$4\r\nEVAL\r\n"));
        p = put_bulk(p, script, script_len);
    }
    return put_ttl(p, (int)numkeys);
}

/* The ticket (ms) as whole µs, decimal, a bulk string. */
static char *put_ticket(char *p, double ticket_ms) {
    char digits[HEADER_MAX];
    int in_range = ticket_ms > 0 && ticket_ms < RL_TICKET_MAX_MS;
    unsigned long long us = in_range ? (unsigned long long)(ticket_ms * 1000.0) : 0;
    return put_bulk(p, digits, (size_t)(put_uint(digits, us) - digits));
}

const char rl_acquire_slot_sha[] = "cff062e5db02a2e1d5a4068ecd397f1eb39bf2a8";

int rl_cmd_acquire_slot(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *value, int ttl_ms,
                        const char *waiter, double ticket, const int *order, int limit) {
    size_t l = (size_t)limit, per_key = keylen + 32 + 2 * HEADER_MAX;
    size_t extra = (l + 1) * per_key + RL_VALUE_LEN + RL_WAITER_ID_LEN + (l + 4) * 2 * HEADER_MAX;
    char *p = eval_head(b, 3 + (l + 1) + 4 + l, by_sha ? rl_acquire_slot_sha : NULL, rl_acquire_slot_script,
                        sizeof(rl_acquire_slot_script) - 1, l + 1, extra);
    if (p == NULL) return -1;
    for (size_t i = 0; i < l; i++) p = put_slot_key(p, order[i], key, keylen);
    p = put_bulk(p, key, keylen);
    p = put_bulk(p, value, RL_VALUE_LEN);
    p = put_ttl(p, ttl_ms);
    p = waiter ? put_bulk(p, waiter, RL_WAITER_ID_LEN) : put(p, LIT("$0\r\n\r\n"));
    p = put_ticket(p, waiter ? ticket : 0);
    for (size_t i = 0; i < l; i++) p = put_ttl(p, order[i]);
    b->len = (size_t)(p - b->data);
    return 0;
}

const char rl_release_slot_sha[] = "955c188169afc387f8ae5a19543f46ee8146e1a1";

int rl_cmd_release_slot(rl_buf *b, int by_sha, const char *key, size_t keylen, const char *sem, size_t semlen,
                        const char *value, int quiet) {
    size_t s = sizeof(rl_release_slot_script) - 1, extra = keylen + semlen + RL_VALUE_LEN + 4 * HEADER_MAX;
    char *p = eval_head(b, quiet ? 7 : 6, by_sha ? rl_release_slot_sha : NULL, rl_release_slot_script, s, 2, extra);
    if (p == NULL) return -1;
    p = put_bulk(p, key, keylen);
    p = put_bulk(p, sem, semlen);
    p = put_bulk(p, value, RL_VALUE_LEN);
    if (quiet) p = put(p, LIT("$5\r\nquiet\r\n"));
    b->len = (size_t)(p - b->data);
    return 0;
}

int rl_cmd_release_slots(rl_buf *b, const char *key, size_t keylen, const char *value, int limit, int only,
                         int except, const char *waiter, double ticket, const char *how) {
    size_t n = only > 0 ? 1 : only < 0 ? 0 : (size_t)limit - (except > 0), howlen = strlen(how);
    char *p = eval_head(b, 3 + n + 6, NULL, rl_release_slots_script, sizeof(rl_release_slots_script) - 1, n,
                        (n + 1) * (keylen + 32 + 2 * HEADER_MAX) + RL_VALUE_LEN + RL_WAITER_ID_LEN + howlen +
                            10 * HEADER_MAX);
    if (p == NULL) return -1;
    for (int s = 1; s <= limit && only >= 0; s++)
        if (only > 0 ? s == only : s != except) p = put_slot_key(p, s, key, keylen);
    p = put_bulk(p, value, RL_VALUE_LEN);
    p = put_bulk(p, how, howlen);
    p = waiter ? put_bulk(p, waiter, RL_WAITER_ID_LEN) : put(p, LIT("$0\r\n\r\n"));
    p = put_bulk(p, key, keylen);
    p = put_ttl(p, limit);
    p = put_ticket(p, waiter ? ticket : 0);
    b->len = (size_t)(p - b->data);
    return 0;
}
