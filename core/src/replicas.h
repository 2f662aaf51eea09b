/* replicas.h — votes that count only once a node's replicas have the
 * write (rl_options.replicas, a node URL's ?replicas=N). A round's write
 * that grants or prolongs a hold is followed, on the same connection, by
 * WAIT want timeout; the node's "yes" is held (round.h, rl_round_await)
 * until WAIT's reply says at least want replicas have every write of that
 * connection so far, ours included. Fewer is a failed vote, undone like
 * any other. Releases never wait: a key a failover forgets is one we gave
 * up anyway. */
#ifndef RL_REPLICAS_H
#define RL_REPLICAS_H

#include <stddef.h>

#include "redlock.h"
#include "url.h"

typedef struct rl_replicas {
    int timeout_ms;                 /* WAIT's timeout, the same for every node */
    int want[RL_MAX_NODES];         /* replicas node i's votes wait for (0: none, no WAIT) */
    char cmd[RL_MAX_NODES][64];     /* node i's WAIT want timeout, RESP */
    size_t len[RL_MAX_NODES];       /* its length (0: none) */
} rl_replicas;

/* Fill r for the n nodes of urls under opts (checked: replicas from 0 to
 * RL_MAX_REPLICAS): each node's own ?replicas=N, else opts->replicas. */
void rl_replicas_init(rl_replicas *r, const rl_url *urls, int n, const rl_options *opts);

/* WAIT's timeout under opts: half the smaller of the node timeout and the
 * stall watchdog's period, at least 1 ms. Its reply then comes within the
 * node timeout, and the node is never silent long enough to be suspect
 * while WAIT blocks. */
int rl_replicas_timeout(const rl_options *opts);

/* 1 if a round of kind (RL_OP_*, RL_ROUND_*) sends node its WAIT behind
 * the write: every kind but a release, on a node that wants replicas. */
int rl_replicas_waits(const rl_replicas *r, int kind, int node);

#endif
