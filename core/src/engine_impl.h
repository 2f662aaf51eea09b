/* engine_impl.h — the engine's own state, shared by the files that make
 * it up and by nothing else: engine.c (the engine object, its nodes, its
 * time), links.c (what the driver reports and is asked, link by link),
 * ops.c (operation slots and their phases), begin.c (beginning
 * operations) and collect.c (handing results back). Drivers see
 * redlock.h; the engine's other parts (keep.c, substream.c, watches.c)
 * see engine.h. */
#ifndef RL_ENGINE_IMPL_H
#define RL_ENGINE_IMPL_H

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
    unsigned sent;           /* bit i: the first round's command went to node i (not if its connection ended first) */
    unsigned owed;           /* bit i: node i still owes a reply to this phase's command (its WAIT's, if sent) */
    unsigned waits;          /* bit i: this phase's command went to node i with a WAIT behind it (replicas.h) */
    unsigned resent;         /* bit i: node i's command went again as EVAL (after NOSCRIPT) in this phase */
    unsigned cleanup_sent;   /* bit i: node i was sent the cleanup */
    unsigned late;           /* bit i: node i was counted late for this operation (stats.c) */
    unsigned set_gen;        /* the generation of the first round (the SETs) */
    rl_mark cleanup_out[RL_MAX_NODES];  /* where each node's cleanup ends in its output */
    rl_buf key;              /* prefix + resource */
    rl_buf cmd;              /* RESP of the current phase's command */
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
    rl_url urls[RL_MAX_NODES];
    rl_stream nodes[RL_MAX_NODES];
    rl_replicas replicas;    /* the WAIT each node's votes wait for (replicas.h) */
    rl_subs subs;            /* hand-off: the resources watched, and the subscriber links */
    char timeout_text[64];   /* "no reply within N ms" */
    rl_waiter waiter;        /* this client in the queues of waiters (hand-off) */
    rl_buf scratch;          /* EVAL fallback commands */

    rl_op **ops;             /* every slot ever allocated, by slot */
    int nops, capops;
    rl_op *free_ops;
    rl_op *done_head, *done_tail;
    int ndone, inflight, tails;
    rl_deadlines deadlines;  /* the current phase's deadline of every op in ROUND, TAIL or CLEANUP */
    rl_keep keep;            /* the keep-alive schedule (keep.c) */
    rl_stats stats;          /* what stats.c counts (the streams and keep-alive count their own) */
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

/* The deadline of op's current phase passed. */
void rl_op_timeout(rl_engine *e, rl_op *op);

/* 1 if every node that was sent op's cleanup has been handed its bytes (or
 * lost the connection), else 0. */
int rl_op_cleanup_out(rl_engine *e, const rl_op *op);

/* slots.c: a semaphore's operations */

/* Encode into b a semaphore's acquire op (its slots in a random order). 0,
 * or -1 when out of memory. */
int rl_slot_acquire_cmd(rl_engine *e, const rl_op *op, rl_buf *b, int ttl_ms);

/* Encode op's release into b: a slot's (waking the semaphore's waiters) or
 * a lock's. 0, or -1 when out of memory. */
int rl_op_release_cmd(const rl_op *op, rl_buf *b, int by_sha, int quiet);

/* Encode into b what undoes a semaphore's acquire op on node: the slot it
 * voted for, or (its vote unknown) every slot, the slot held excepted; a
 * waiter's won acquire also leaves the queue there (even where refused), a
 * lost one is queued again (at its place) where a slot is undone. Return 0, 1 when there is nothing to do there (it
 * voted for the slot held, or refused a loser), or -1 when out of memory. */
int rl_slot_cleanup_cmd(rl_engine *e, const rl_op *op, int node, rl_buf *b);

/* A semaphore's acquire op won a slot: send every node whose vote went
 * elsewhere or is unknown (another slot, a refusal, an error, a timeout,
 * no answer yet) its cleanup (rl_slot_cleanup_cmd); they are owed in the
 * tail. */
void rl_slot_release_strays(rl_engine *e, rl_op *op);

#endif
