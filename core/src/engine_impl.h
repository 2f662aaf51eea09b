/* engine_impl.h — the engine's own state, shared by the files that make
 * it up and by nothing else: engine.c (the engine object, its nodes, its
 * time), links.c (what the driver reports and is asked, link by link),
 * ops.c (operation slots and their phases), begin.c (beginning
 * operations) and collect.c (handing results back). Drivers see
 * redlock.h; the engine's other parts (keep.c, substream.c, watches.c)
 * see engine.h. */
#ifndef RL_ENGINE_IMPL_H
#define RL_ENGINE_IMPL_H

#include "cluster.h"
#include "command.h"
#include "deadlines.h"
#include "replicas.h"
#include "engine.h"
#include "round.h"
#include "stats.h"
#include "stream.h"
#include "substream.h"

enum { OP_FREE = 0, OP_ROUND, OP_TAIL, OP_CLEANUP, OP_QUIET };

typedef struct rl_op {
    rl_result res;
    rl_round round;
    int slot;
    unsigned uses;           /* operations begun in this slot: the high bits of its id */
    unsigned gen;
    int phase;
    int taken;               /* the result was collected */
    int ttl_ms;              /* acquire/extend: the ttl asked for */
    int quiet;               /* a release that wakes nobody (rl_engine_begin_release_quiet) */
    long long token;         /* a fenced acquire: the token its commit raises the counters to */
    rl_keep_ref kept;        /* a round of the keep-alive schedule: its lock (entry -1: the driver's) */
    int sem_limit;           /* a semaphore's acquire: its limit (key: the semaphore's); else 0 */
    int sem_slot;            /* a release or extension of a semaphore's slot (key: the slot's); else 0 */
    double sem_ticket;       /* a semaphore's acquire by a waiter: its ticket (its place in the queue); else 0 */
    unsigned long long sem_seed; /* a semaphore's acquire: what its order of the slots is drawn from
                                    (rl_slot_draw), the same in every send of it */
    unsigned sent;           /* bit i: the first round's command went to node i (not if its connection ended first) */
    unsigned owed;           /* bit i: node i still owes a reply to this phase's command (its WAIT's, if sent) */
    unsigned waits;          /* bit i: this phase's command went to node i with a WAIT behind it (replicas.h) */
    unsigned char wait_mark[RL_MAX_NODES]; /* with waits: which send of node i's write (its EVAL flag and
                                              redirections, ops.c) the WAIT that decides its vote follows */
    unsigned cleanup_sent;   /* bit i: node i was sent the cleanup */
    unsigned deferred;       /* bit i: a won semaphore acquire's node i had not answered at the decision:
                                its cleanup waits for its answer (rl_slot_tail_answer) */
    unsigned late;           /* bit i: node i was counted late for this operation (stats.c) */
    unsigned set_gen;        /* the generation of the first round (the SETs) */
    rl_mark cleanup_out[RL_MAX_NODES];  /* where each node's cleanup ends in its output */
    rl_buf key;              /* prefix + resource */
    int hslot;               /* the key's hash slot, on an engine with cluster nodes (else -1) */
    rl_buf cmd;              /* RESP of the current phase's command */
    rl_buf ccmd;             /* the same on cluster nodes, when its companion keys' names differ there
                                (hashslot.h, rl_cluster_base); len 0: op->cmd goes to every node */
    rl_buf cbase;            /* a lock's (not a semaphore's) companion base, on an engine with cluster
                                nodes: the second key of its scripts there (rl_cmd_with_base) */
    rl_buf ckey;             /* a semaphore's key as cluster nodes name it (len 0: op->key everywhere):
                                its acquire's, the base of the lock key; a slot's, that slot's key
                                made from the base (rl_op_swap_key) */
    struct rl_op *prev, *next;  /* done list (doubly linked) or free list (next only) */
} rl_op;

/* A client's id in the queues of waiters, drawn again in a forked child (an
 * engine made before nginx forks its workers serves each of them). */
typedef struct rl_waiter {
    unsigned generation;     /* rl_fork_generation() when drawn */
    char id[RL_WAITER_ID_LEN + 1];
} rl_waiter;


struct rl_engine {
    char errstr[RL_ERR_LEN];
    rl_options opts;
    char *prefix;
    int nnodes;
    int quorum;
    double now;              /* the latest time a caller gave (time never goes back) */
    int max_ttl_ms;          /* the longest ttl an acquire or extend asked for: no key a
                                kept release deletes outlives it (rl_stream_expire_redo) */
    rl_url urls[RL_MAX_NODES];
    rl_stream nodes[RL_MAX_NODES];
    rl_replicas replicas;    /* the WAIT each node's votes wait for (replicas.h) */
    rl_subs subs;            /* hand-off: the resources watched, and the subscriber links */
    char timeout_text[64];   /* "no reply within N ms" */
    rl_waiter waiter;        /* this client in the queues of waiters (hand-off) */
    rl_buf scratch;          /* EVAL fallback commands */
    rl_cluster *clusters[RL_MAX_NODES]; /* node i's cluster, or NULL for a plain node (cluster.c) */
    rl_shard *shards[RL_MAX_SHARDS];    /* every cluster node's shards, by number */
    int nshards;
    int nclusters;           /* nodes that are clusters */
    rl_buf redirect;         /* a command MOVED or ASK sends again (cluster.c) */
    struct rl_retry *retries; /* commands refused with TRYAGAIN, to go again (cluster_retry.c) */
    int nretries, capretries;
    rl_buf base;             /* a key's companion base on cluster nodes (rl_cluster_base) */
    rl_buf scratch2;         /* a command in scratch as a cluster node gets it (rl_op_cluster_form) */

    rl_op **ops;             /* every slot ever allocated, by slot */
    int nops, capops;
    rl_op *free_ops;
    rl_op *done_head, *done_tail;
    int ndone, inflight, tails;
    rl_deadlines deadlines;  /* the current phase's deadline of every op in ROUND, TAIL or CLEANUP */
    rl_keep keep;            /* the keep-alive schedule (keep.c) */
    rl_stats stats;          /* what stats.c counts (the streams and keep-alive count their own) */
    int untimed_reads;       /* rl_engine_untimed_reads: replies fed now are not timed */
    char label[RL_LABEL_MAX + 1]; /* carried at the start of every lock value made ("": none) */
};

/* The time of this call: never before the last one. */
static inline double clock_at(rl_engine *e, double now_ms) {
    if (now_ms > e->now) e->now = now_ms;
    return e->now;
}

/* ops.c */

/* A free slot (reused, or allocated once), or NULL if every slot is taken
 * (e->nops == RL_OPID_MAX_SLOTS) or memory ran out. */
rl_op *rl_op_alloc(rl_engine *e);

/* Put op on the free list. */
void rl_op_free(rl_engine *e, rl_op *op);

/* Start a round of kind with op->cmd on every node, its clock started at
 * start_ms; a node that cannot take it votes against at once (which may
 * decide it). first: the operation's first round, whose nodes are the ones
 * a failed acquire's cleanup goes to. */
void rl_op_send_round(rl_engine *e, rl_op *op, int kind, double start_ms, int first);

/* A node's reply (or, reply NULL, its failure errstr) to the command
 * ticket t: every stream's callback (owner: the engine). */
void rl_op_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr);

/* rl_op_reply for a reply that came on stream s (node's own, or one of its
 * shards). */
void rl_op_reply_from(rl_engine *e, rl_stream *s, int node, rl_ticket t, const rl_reply *reply, const char *errstr);

/* Cluster node `node` followed MOVED or ASK with the write of ticket t,
 * sent again through shard `to` (cluster_redirect.c): if that write waits
 * for replicas, its WAIT goes behind it there, and only that WAIT decides
 * the vote (the one left behind on the old shard proves nothing). */
void rl_op_redirected(rl_engine *e, rl_shard *to, int node, rl_ticket t);

/* May the write of ticket t go again now (after TRYAGAIN)? Only while
 * its operation still waits for it, and a write that takes a key (an
 * acquire, a fence's commit) only while its round is open: once decided,
 * the caller may have released already, and the write sent behind that
 * release would take the key again there, for its ttl. */
int rl_op_may_resend(const rl_engine *e, rl_ticket t);

/* Node's write of ticket t will go again later (ticket t being that
 * later send): the WAIT behind the earlier send proves nothing. */
void rl_op_resend_later(rl_engine *e, int node, rl_ticket t);

/* Node's write of ticket t, kept to go again, may not (rl_op_may_resend)
 * or could not be sent: reply (the refusal it met, on stream s), or the
 * failure errstr, is its answer after all. */
void rl_op_resend_refused(rl_engine *e, rl_stream *s, int node, rl_ticket t, const rl_reply *reply,
                          const char *errstr);

/* The command op sends node i in its current phase: op->ccmd on a cluster
 * node when it has one, else op->cmd. */
static inline const rl_buf *rl_op_cmd(const rl_engine *e, const rl_op *op, int i) {
    return e->clusters[i] && op->ccmd.len ? &op->ccmd : &op->cmd;
}

/* Write into dst src as cluster nodes get it: with op's companion base as
 * a second key (rl_cmd_with_base), for a lock's scripts that start with
 * RL_BASE. 0, 1 when nothing changes there (dst empty: src goes as it is;
 * a semaphore's op, an engine without cluster nodes, a SET, a fenced
 * script), or -1 when out of memory. */
static inline int rl_op_cluster_form(const rl_engine *e, const rl_op *op, const rl_buf *src, rl_buf *dst) {
    dst->len = 0;
    if (e->nclusters == 0 || op->sem_limit > 0 || op->sem_slot > 0) return 1;
    return rl_cmd_with_base(dst, src, op->cbase.data, op->cbase.len);
}

/* What goes to node i out of scratch (just encoded for every node): on a
 * cluster node its cluster form, in e->scratch2, when it has one. NULL
 * when out of memory. */
static inline const rl_buf *rl_op_scratch_for(rl_engine *e, const rl_op *op, int i) {
    if (e->clusters[i] == NULL) return &e->scratch;
    int rc = rl_op_cluster_form(e, op, &e->scratch, &e->scratch2);
    return rc < 0 ? NULL : rc == 0 ? &e->scratch2 : &e->scratch;
}

/* Swap op->key and op->ckey when node i is a cluster node and op has a
 * cluster key (i < 0: whenever op has one), so that an encoder reading
 * op->key encodes the cluster form; 1 if swapped (swap again after). */
static inline int rl_op_swap_key(const rl_engine *e, rl_op *op, int i) {
    if (op->ckey.len == 0 || (i >= 0 && e->clusters[i] == NULL)) return 0;
    rl_buf t = op->key;
    op->key = op->ckey;
    op->ckey = t;
    return 1;
}

/* Nobody will collect acquire op (its driver is closing), which is in its
 * round, or decided and granted (in its tail, or quiet): off the done list
 * already. Its result is dropped, and it goes on to a failed acquire's
 * cleanup on every node its acquire went to (op->sent), whose slot is
 * freed when the cleanup ends. */
void rl_op_abandon(rl_engine *e, rl_op *op);

/* The deadline of op's current phase passed. */
void rl_op_timeout(rl_engine *e, rl_op *op);

/* 1 if every node that was sent op's cleanup has been handed its bytes (or
 * lost the connection), else 0. */
int rl_op_cleanup_out(rl_engine *e, const rl_op *op);

/* slots.c: a semaphore's operations */

/* Draw a semaphore's acquire op a random order of its slots (rl_random),
 * which every encoding of it then uses. */
void rl_slot_draw(rl_op *op);

/* Encode into b a semaphore's acquire op (its slots in the order drawn),
 * and into cb, when op has a cluster key, its cluster form; by its
 * script's SHA1 (EVALSHA) or, by_sha 0, the script itself. 0, or -1 when
 * out of memory. */
int rl_slot_acquire_cmd(rl_engine *e, rl_op *op, rl_buf *b, rl_buf *cb, int ttl_ms, int by_sha);

/* Encode op's release into b: a slot's (waking the semaphore's waiters) or
 * a lock's (naming e's waiter id as the releaser, unless quiet). 0, or -1
 * when out of memory. */
int rl_op_release_cmd(rl_engine *e, const rl_op *op, rl_buf *b, int by_sha, int quiet);

/* Encode into b what undoes a semaphore's acquire op on node: the slot it
 * voted for, or (its vote unknown) every slot, the slot held excepted; a
 * waiter's won acquire also leaves the queue there (even where refused), a
 * lost one is queued again (at its place) where a slot is undone. Return 0, 1 when there is nothing to do there (it
 * voted for the slot held, or refused a loser), or -1 when out of memory. */
int rl_slot_cleanup_cmd(rl_engine *e, const rl_op *op, int node, rl_buf *b);

/* A semaphore's acquire op won a slot: send every node whose vote went
 * elsewhere or is unknown (another slot, a refusal, an error, a timeout)
 * its cleanup (rl_slot_cleanup_cmd); they are owed in the tail. A node
 * that has not answered yet is deferred: what it took is known once it
 * answers (rl_slot_tail_answer), and most answer with the slot held,
 * which needs nothing undone. */
void rl_slot_release_strays(rl_engine *e, rl_op *op);

/* The answer of node (reply NULL: none, the connection ended) to op's
 * acquire, in its tail: a deferred node is sent the cleanup that answer
 * calls for, if any (owed in the tail). */
void rl_slot_tail_answer(rl_engine *e, rl_op *op, int node, const rl_reply *reply);

/* op's tail is over: every node still deferred is sent the cleanup of an
 * unknown vote (every slot but the one held; it runs after the acquire). */
void rl_slot_tail_over(rl_engine *e, rl_op *op);

#endif
