/* engine.h — what the library's own drivers need of the engine beyond
 * redlock.h's rl_engine_* functions. */
#ifndef RL_ENGINE_H
#define RL_ENGINE_H

#include "keep.h"
#include "redlock.h"
#include "substream.h"
#include "url.h"

/* The parsed URL of node i (0 <= i < rl_engine_nodes). */
const rl_url *rl_engine_node_url(const rl_engine *e, int i);

/* The engine's subscriptions, for substream.c's rl_engine_watch and the
 * like (not for drivers). now_ms not NULL: the engine's clock moves to it
 * (never back), and *now_ms becomes the engine's time. */
rl_subs *rl_engine_subs(const rl_engine *e, double *now_ms);

/* For a finished operation id: the latest moment worth keeping the driver
 * running so that a command of it still held behind the setup of a
 * connection begun less than a node timeout before goes out (the setup's
 * replies are due by then); 0 if there is none. */
double rl_engine_held_until(const rl_engine *e, int id);

/* 1 if operation id is finished (collectable), 0 if in flight, RL_ERR if
 * it names no operation. */
int rl_engine_finished(const rl_engine *e, int id);

/* 1 if operation id is a failed acquire whose cleanup (the release on the
 * nodes its SET may have reached) is not all written yet: some of it still
 * sits in our output for a connection that is up (its socket full: the
 * node is working through a backlog) or still being set up; 0 otherwise
 * (written, or its connection ended: the release is then kept for the
 * node's next connection). */
int rl_engine_cleanup_unwritten(rl_engine *e, int id);

/* The id of the oldest finished operation (the one rl_engine_collect would
 * hand back), or -1 if none. */
int rl_engine_first_done(const rl_engine *e);

/* The keep-alive schedule of e (keep.c). */
rl_keep *rl_engine_keeps(rl_engine *e);

/* e's clock at now_ms: never before the time an earlier call gave. */
double rl_engine_clock(rl_engine *e, double now_ms);

/* Set the text rl_engine_errstr reports. */
void rl_engine_fail(rl_engine *e, const char *why);

/* Begin a round of the keep-alive schedule: an extension (kind
 * RL_OP_EXTEND) or a release (RL_OP_RELEASE) of the kept lock ref names.
 * Its result goes to rl_keep_result (at once, if the round is decided while
 * it begins), never to rl_engine_collect or rl_engine_take. Return its id,
 * or RL_ERR / RL_ERR_FULL as rl_engine_begin_* do. */
int rl_engine_begin_kept(rl_engine *e, int kind, const char *resource, size_t len, const char *value, int ttl_ms,
                         rl_keep_ref ref, double now_ms);

#endif
