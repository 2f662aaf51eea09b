/* stats.h — the engine's counting (redlock.h, "Counting"), kept apart from
 * what it counts: the engine's files call these at the moments they decide
 * something (a round decided, a reply in, a node late), the streams and
 * keep-alive bump plain counters of their own, and stats.c gathers it all
 * into an rl_stats. Nothing here allocates, does I/O or reads a clock. */
#ifndef RL_STATS_H
#define RL_STATS_H

#include "redlock.h"

/* What a node's command stream counts itself (stream.c, stream_io.c): the
 * fields of rl_node_stats of the same names. */
typedef struct rl_stream_counts {
    unsigned long long connects, reconnects, resets, lost, step_checks, suspected;
} rl_stream_counts;

struct rl_op;

/* Count one time of ms in h. */
void rl_histogram_add(rl_histogram *h, double ms);

/* op's round is decided (its result as it stands now, before a commit or
 * a cleanup follows): its kind and outcome, decision time and every
 * node's vote; a keep-alive round's outcome in keep_extends/keep_releases. */
void rl_count_decided(rl_engine *e, const struct rl_op *op);

/* A decided round goes on as a tail (nodes still owe replies), or a
 * failed acquire's cleanup begins. */
void rl_count_tail(rl_engine *e);
void rl_count_cleanup(rl_engine *e);

/* Node answered a command queued at sent_ms (the engine's clock is now). */
void rl_count_reply(rl_engine *e, int node, double sent_ms);

/* Node left a command of op (its round, the round's tail, or its cleanup)
 * unanswered past the node timeout: counted once per node and operation. */
void rl_count_late(rl_engine *e, struct rl_op *op, int node);

#endif
