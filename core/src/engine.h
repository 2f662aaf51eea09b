/* engine.h — the engine's inside, for its own parts (keep.c, substream.c,
 * watches.c): no driver includes it. A driver has redlock.h's
 * rl_engine_* functions and nothing else. */
#ifndef RL_ENGINE_H
#define RL_ENGINE_H

#include "keep.h"
#include "redlock.h"
#include "substream.h"
#include "url.h"

/* The engine's subscriptions, for substream.c's rl_engine_watch and the
 * like (not for drivers). now_ms not NULL: the engine's clock moves to it
 * (never back), and *now_ms becomes the engine's time. */
rl_subs *rl_engine_subs(const rl_engine *e, double *now_ms);

/* The keep-alive schedule of e (keep.c). */
rl_keep *rl_engine_keeps(rl_engine *e);

/* e's clock at now_ms: never before the time an earlier call gave. */
double rl_engine_clock(rl_engine *e, double now_ms);

/* Set the text rl_engine_errstr reports. */
void rl_engine_fail(rl_engine *e, const char *why);

/* 0 if resource (len bytes) may name a lock of e: not empty, not longer
 * than a key may be with e's prefix, not reserved; else -1, the reason
 * set as rl_engine_errstr's (the checks every rl_engine_begin_* makes). */
int rl_engine_check_resource(rl_engine *e, const char *resource, size_t len);

/* The first two of those checks (not empty, not too long), for a name that
 * is only listened on (rl_engine_watch). */
int rl_engine_check_name(rl_engine *e, const char *resource, size_t len);

/* Begin a round of the keep-alive schedule: an extension (kind
 * RL_OP_EXTEND) or a release (RL_OP_RELEASE) of the kept lock ref names
 * (slot: the semaphore's slot it holds, or 0 for a lock).
 * Its result goes to rl_keep_result (at once, if the round is decided while
 * it begins), never to rl_engine_collect or rl_engine_take. Return its id,
 * or RL_ERR / RL_ERR_FULL as rl_engine_begin_* do. */
int rl_engine_begin_kept(rl_engine *e, int kind, const char *resource, size_t len, int slot, const char *value,
                         int ttl_ms, rl_keep_ref ref, double now_ms);

#endif
