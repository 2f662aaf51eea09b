/* round.h — one Redlock round, free of any transport: per-node votes, the
 * quorum arithmetic, early decision and validity timing. It consumes parsed
 * replies and clock readings; it never touches a socket. */
#ifndef RL_ROUND_H
#define RL_ROUND_H

#include "redlock.h"
#include "reply.h"

/* Round kinds beside RL_OP_*: a fenced lock's two rounds. Their result is
 * an acquire's (rl_result.op is RL_OP_ACQUIRE). */
enum {
    RL_ROUND_ACQUIRE_FENCED = 4,  /* SET NX PX + INCR: the counter (decimal bulk string) for, nil against */
    RL_ROUND_COMMIT = 5,          /* raise the counter if ours: 1 for, 0 against */
    RL_ROUND_ACQUIRE_SLOT = 6,    /* a semaphore's acquire: the slot taken (1 to limit) for it, nil against */
    RL_ROUND_REPLICAS = 7         /* not a round: the WAIT behind a round's write (replicas.h), an integer */
};

typedef struct rl_round {
    int kind;             /* RL_OP_* or RL_ROUND_*: what the command was */
    long long top;        /* RL_ROUND_ACQUIRE_FENCED: the highest counter a vote for returned */
    rl_result *res;       /* where votes and the outcome are written */
    int ttl_ms;           /* acquire/extend: the ttl asked for */
    double drift_factor;
    double start_ms;      /* clock reading taken before the first send */
    int pending;          /* nodes that have not voted yet */
    int limit;            /* RL_ROUND_ACQUIRE_SLOT: the semaphore's slots (set by the caller; rl_round_start keeps it) */
    int settle_loss;      /* RL_ROUND_ACQUIRE_SLOT: a loss waits for every vote (set by the caller; kept likewise) */
    short voted[RL_MAX_NODES]; /* RL_ROUND_ACQUIRE_SLOT: the slot each node voted for (0: none) */
    unsigned awaiting;    /* bit i: node i's vote for waits for its WAIT's reply (rl_round_await) */
    unsigned held;        /* bit i: node i's write said yes; its vote waits for WAIT */
    long long held_value[RL_MAX_NODES]; /* what that yes carried (a fenced counter, a slot) */
} rl_round;

/* Start a round of kind (RL_OP_* or RL_ROUND_*) over nodes nodes needing
 * quorum votes; reset *res (except res->id, res->value and res->token).
 * start_ms must be read before anything is sent (a commit round passes its
 * acquire's: validity counts from there). */
void rl_round_start(rl_round *r, rl_result *res, int kind, int nodes, int quorum, int ttl_ms,
                    double drift_factor, double start_ms);

/* Record node's vote (RL_NODE_OK/TAKEN/ERROR/TIMEOUT; errstr may be NULL).
 * Votes after the decision, or a second vote by one node, are ignored.
 * Return 1 if this vote decided the round, else 0. */
int rl_round_vote(rl_round *r, int node, int state, const char *errstr, double now_ms);

/* Classify a reply to the round's command and vote with it. A NULL reply is
 * an error vote with the text in errstr (e.g. "connection lost").
 * Return as rl_round_vote. */
int rl_round_reply(rl_round *r, int node, const rl_reply *reply, const char *errstr, double now_ms);

/* Node i was sent a WAIT behind the round's write: a reply that votes for
 * is held (rl_round_reply counts it not) until rl_round_replicas. */
void rl_round_await(rl_round *r, int node);

/* The reply to node's WAIT (NULL: none, errstr says why), which wanted
 * want replicas within timeout_ms: the vote its write's reply held counts
 * if the reply reports at least want, else node fails its vote ("1 of 2
 * replicas acknowledged the write within 25 ms"). Nothing if no vote is
 * held (the write said no, or the round is decided). Return as
 * rl_round_vote. */
int rl_round_replicas(rl_round *r, int node, const rl_reply *reply, const char *errstr, int want, int timeout_ms,
                      double now_ms);

/* The node timeout passed: every node still pending votes RL_NODE_TIMEOUT
 * with errstr. The round is decided afterwards. Return 1 if this decided it. */
int rl_round_expire(rl_round *r, const char *errstr, double now_ms);

/* 1 if reply has a shape the command of kind (RL_OP_*, RL_ROUND_*) can answer with. A
 * reply that does not fit answers some other command (a reply was lost, or
 * the node sent one too many) or the node is broken: either way nothing on
 * the connection can be trusted any more. */
int rl_reply_fits(int kind, const rl_reply *reply);

/* Why a connection is reset for a reply that does not fit the command of
 * kind: what came and what was expected, e.g. "connection reset: an
 * integer reply where SET's was expected (replies out of step?)", in buf
 * (len bytes; at most RL_NODE_ERR_LEN are ever needed). Return buf. */
const char *rl_reply_misfit_text(int kind, const rl_reply *reply, char *buf, size_t len);

/* The slot a reply to a semaphore's acquire says its node took (a late
 * one included), or 0 (nil, an error, another kind of round). */
int rl_round_slot_of(const rl_round *r, const rl_reply *reply);

/* 1 once the outcome is certain. */
int rl_round_decided(const rl_round *r);

#endif
