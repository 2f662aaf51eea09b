/* round.c — votes, quorum and validity for one round (see round.h). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "round.h"

void rl_round_start(rl_round *r, rl_result *res, int kind, int nodes, int quorum, int ttl_ms,
                    double drift_factor, double start_ms) {
    r->kind = kind;
    r->top = 0;
    r->res = res;
    r->ttl_ms = ttl_ms;
    r->drift_factor = drift_factor;
    r->start_ms = start_ms;
    r->pending = nodes;
    r->awaiting = r->held = 0;
    memset(r->voted, 0, sizeof(r->voted));
    res->op = kind >= RL_ROUND_ACQUIRE_FENCED ? RL_OP_ACQUIRE : kind;
    res->status = RL_STATUS_PENDING;
    res->nodes = nodes;
    res->quorum = quorum;
    res->ok = res->taken = res->failed = res->heard = 0;
    res->elapsed_ms = res->validity_ms = 0;
    for (int i = 0; i < nodes; i++) {
        res->node[i].state = RL_NODE_PENDING;
        res->node[i].errstr[0] = '\0';
    }
}

int rl_round_decided(const rl_round *r) {
    return r->res->status != RL_STATUS_PENDING;
}

/* Validity left after elapsed_ms: ttl - elapsed - (ttl * drift + 2 ms). */
static double validity(const rl_round *r, double elapsed_ms) {
    return r->ttl_ms - elapsed_ms - (r->ttl_ms * r->drift_factor + 2.0);
}

/* A semaphore's acquire: the slot with the most votes (the lowest of
 * those tied) and its votes. */
static int best_slot(const rl_round *r, int *votes) {
    int best = 0, most = 0;
    for (int i = 0; i < r->res->nodes; i++) {
        int s = r->voted[i], n = 0;
        if (s == 0) continue;
        for (int j = 0; j < r->res->nodes; j++) n += r->voted[j] == s;
        if (n > most || (n == most && s < best)) best = s, most = n;
    }
    *votes = most;
    return best;
}

/* A semaphore's acquire is decided when one slot has a quorum of votes, or
 * when no slot can reach one any more: the slot with the most votes, with
 * every node still to answer added, is short of a quorum, and those nodes
 * cannot make the difference between busy and unavailable; with settle_loss
 * (a queued waiter's acquire, which sleeps after a loss anyway), only once
 * every node has voted or timed out, so that its cleanup goes only to the
 * nodes that took a slot for it, not to every node yet to answer. Two different
 * slots can never both reach a quorum in one round (each node votes once),
 * so deciding at the first slot to reach one picks the only one that can.
 * res->ok becomes the votes of the slot held (or the best one), res->taken
 * the nodes whose votes went elsewhere (nil, or another slot): busy when
 * those alone leave no slot a quorum. */
static int slot_decide(rl_round *r, double now_ms) {
    rl_result *res = r->res;
    int votes, slot = best_slot(r, &votes), voted = res->ok;
    /* against the best slot: refusals and votes for other slots. As for a
     * lock (try_decide), the nodes still to answer may be what makes it
     * busy: one node down must not turn busy into unavailable by failing
     * first (their node timeout bounds the wait) */
    int against = res->taken + voted - votes, spare = res->nodes - res->quorum;
    int may_be_busy = against <= spare && against + r->pending > spare;
    if (votes < res->quorum && r->pending > 0 &&
        (votes + r->pending >= res->quorum || r->settle_loss || may_be_busy))
        return 0;
    res->ok = votes;
    res->taken += voted - votes;
    res->elapsed_ms = now_ms - r->start_ms;
    if (votes >= res->quorum) {
        res->validity_ms = validity(r, res->elapsed_ms);
        res->status = res->validity_ms > 0 ? RL_STATUS_OK : RL_STATUS_TIMEOUT;
        res->slot = res->status == RL_STATUS_OK ? slot : 0;
    } else {
        res->status = res->taken > res->nodes - res->quorum ? RL_STATUS_BUSY : RL_STATUS_UNAVAILABLE;
    }
    return 1;
}

/* Decide if the outcome is certain: quorum reached, or no longer reachable.
 * Every kind of round decides this way; the nodes that have not answered
 * yet are its tail, which the engine goes on serving without the caller. */
static int try_decide(rl_round *r, double now_ms) {
    rl_result *res = r->res;
    int against = res->nodes - res->quorum; /* votes against that still leave quorum possible */
    if (r->kind == RL_ROUND_ACQUIRE_SLOT) return slot_decide(r, now_ms);
    if (res->ok >= res->quorum) {
        res->elapsed_ms = now_ms - r->start_ms;
        if (res->op == RL_OP_RELEASE) {
            res->status = RL_STATUS_OK;
        } else {
            res->validity_ms = validity(r, res->elapsed_ms);
            res->status = res->validity_ms > 0 ? RL_STATUS_OK : RL_STATUS_TIMEOUT;
        }
        return 1;
    }
    if (res->ok + r->pending < res->quorum) {
        /* No quorum now, but which word: the nodes still to answer may be
         * the holders that make it busy (not held), not unavailable. One
         * node down must not turn "busy" into "unavailable" by answering
         * first: wait for them (their node timeout bounds it). */
        if (res->taken <= against && res->taken + r->pending > against) return 0;
        res->elapsed_ms = now_ms - r->start_ms;
        /* against: another value holds it (a lock), ours is gone (the rest) */
        if (res->taken > against)
            res->status = r->kind == RL_OP_ACQUIRE || r->kind == RL_ROUND_ACQUIRE_FENCED ? RL_STATUS_BUSY
                                                                                        : RL_STATUS_NOT_HELD;
        else
            res->status = RL_STATUS_UNAVAILABLE;
        return 1;
    }
    return 0;
}

int rl_round_vote(rl_round *r, int node, int state, const char *errstr, double now_ms) {
    rl_result *res = r->res;
    if (rl_round_decided(r) || node < 0 || node >= res->nodes || res->node[node].state != RL_NODE_PENDING)
        return 0;
    rl_node_result *n = &res->node[node];
    n->state = state;
    switch (state) {
    case RL_NODE_OK: res->ok++; break;
    case RL_NODE_TAKEN: res->taken++; break;
    default:
        n->state = state == RL_NODE_TIMEOUT ? RL_NODE_TIMEOUT : RL_NODE_ERROR;
        res->failed++;
        snprintf(n->errstr, sizeof(n->errstr), "%s", errstr ? errstr : "error");
        break;
    }
    r->pending--;
    return try_decide(r, now_ms);
}

int rl_reply_fits(int kind, const rl_reply *reply) {
    if (reply->type == RL_REPLY_ERROR) return 1;
    if (kind == RL_OP_ACQUIRE) return reply->type == RL_REPLY_STATUS || reply->type == RL_REPLY_NIL;
    if (kind == RL_ROUND_ACQUIRE_FENCED) return reply->type == RL_REPLY_STRING || reply->type == RL_REPLY_NIL;
    if (kind == RL_ROUND_ACQUIRE_SLOT) return reply->type == RL_REPLY_INTEGER || reply->type == RL_REPLY_NIL;
    return reply->type == RL_REPLY_INTEGER; /* a release's, an extension's, a commit's, a WAIT's */
}

/* A reply's type as a message says it. */
static const char *reply_said(const rl_reply *reply) {
    switch (reply->type) {
    case RL_REPLY_STRING: return "a string";
    case RL_REPLY_ARRAY: return "an array";
    case RL_REPLY_INTEGER: return "an integer";
    case RL_REPLY_NIL: return "a nil";
    case RL_REPLY_STATUS: return "a status";
    default: return "an error";
    }
}

/* The command of a kind as a message says it (whose reply was expected). */
static const char *command_said(int kind) {
    switch (kind) {
    case RL_OP_ACQUIRE: return "SET's";
    case RL_OP_RELEASE: return "a release's";
    case RL_OP_EXTEND: return "an extension's";
    case RL_ROUND_ACQUIRE_FENCED: return "a fenced acquire's";
    case RL_ROUND_COMMIT: return "a fence commit's";
    case RL_ROUND_ACQUIRE_SLOT: return "a slot acquire's";
    case RL_ROUND_REPLICAS: return "WAIT's";
    default: return "another";
    }
}

const char *rl_reply_misfit_text(int kind, const rl_reply *reply, char *buf, size_t len) {
    snprintf(buf, len, "connection reset: %s reply where %s was expected (replies out of step?)", reply_said(reply),
             command_said(kind));
    return buf;
}

/* What a reply means for the round's command; a fenced grant's counter,
 * or the slot a semaphore's acquire took (checked against limit), goes to
 * *counter. */
static int classify(int kind, int limit, const rl_reply *reply, long long *counter, char *why, size_t whylen) {
    if (reply->type == RL_REPLY_ERROR) {
        snprintf(why, whylen, "%s", reply->str);
        return RL_NODE_ERROR;
    }
    if (kind == RL_OP_ACQUIRE) {
        if (reply->type == RL_REPLY_STATUS && reply->len == 2 && strncasecmp(reply->str, "OK", 2) == 0)
            return RL_NODE_OK;
        if (reply->type == RL_REPLY_NIL) return RL_NODE_TAKEN;
    } else if (kind == RL_ROUND_ACQUIRE_FENCED) {
        if (reply->type == RL_REPLY_STRING && rl_fence_token(reply->str, reply->len, counter)) return RL_NODE_OK;
        if (reply->type == RL_REPLY_NIL) return RL_NODE_TAKEN;
        if (reply->type == RL_REPLY_STRING) {
            snprintf(why, whylen, "fence counter is not a positive integer: the grant answered \"%.24s\"",
                     reply->str);
            return RL_NODE_ERROR;
        }
    } else if (kind == RL_ROUND_ACQUIRE_SLOT) {
        if (reply->type == RL_REPLY_NIL) return RL_NODE_TAKEN;
        if (reply->type == RL_REPLY_INTEGER && reply->integer >= 1 && reply->integer <= limit) {
            *counter = reply->integer;
            return RL_NODE_OK;
        }
    } else if (reply->type == RL_REPLY_INTEGER &&
               (reply->integer == 0 || reply->integer == 1 || (kind == RL_OP_RELEASE && reply->integer == 2))) {
        return reply->integer >= 1 ? RL_NODE_OK : RL_NODE_TAKEN; /* a release's 2: deleted, and a waiter heard it */
    }
    snprintf(why, whylen, "unexpected reply (type %d)", reply->type);
    return RL_NODE_ERROR;
}

/* node votes for, carrying counter (a fenced grant's, a slot taken);
 * heard: a release that a waiter heard. What a vote for carries counts
 * only while the round is open. */
static int vote_for(rl_round *r, int node, long long counter, int heard, double now_ms) {
    if (!rl_round_decided(r) && r->res->node[node].state == RL_NODE_PENDING) {
        if (r->kind == RL_ROUND_ACQUIRE_FENCED && counter > r->top) r->top = counter;
        if (r->kind == RL_OP_RELEASE && heard) r->res->heard++;
        if (r->kind == RL_ROUND_ACQUIRE_SLOT) r->voted[node] = (short)counter;
    }
    return rl_round_vote(r, node, RL_NODE_OK, NULL, now_ms);
}

int rl_round_reply(rl_round *r, int node, const rl_reply *reply, const char *errstr, double now_ms) {
    char why[RL_NODE_ERR_LEN];
    long long counter = 0;
    unsigned bit = node >= 0 && node < RL_MAX_NODES ? 1u << node : 0;
    int waits = (r->awaiting & bit) != 0;
    r->awaiting &= ~bit;
    if (reply == NULL) return rl_round_vote(r, node, RL_NODE_ERROR, errstr ? errstr : "connection lost", now_ms);
    int state = classify(r->kind, r->limit, reply, &counter, why, sizeof(why));
    if (state != RL_NODE_OK) return rl_round_vote(r, node, state, why, now_ms);
    if (waits && !rl_round_decided(r)) { /* the vote waits for the replicas */
        r->held |= bit;
        r->held_value[node] = counter;
        return 0;
    }
    return vote_for(r, node, counter, r->kind == RL_OP_RELEASE && reply->integer == 2, now_ms);
}

void rl_round_await(rl_round *r, int node) {
    if (node >= 0 && node < RL_MAX_NODES) r->awaiting |= 1u << node;
}

int rl_round_replicas(rl_round *r, int node, const rl_reply *reply, const char *errstr, int want, int timeout_ms,
                      double now_ms) {
    char why[RL_NODE_ERR_LEN];
    unsigned bit = node >= 0 && node < RL_MAX_NODES ? 1u << node : 0;
    if (!(r->held & bit)) return 0;
    r->held &= ~bit;
    if (reply && reply->type == RL_REPLY_INTEGER && reply->integer >= want)
        return vote_for(r, node, r->held_value[node], 0, now_ms);
    if (reply == NULL) snprintf(why, sizeof(why), "WAIT unanswered: %s", errstr ? errstr : "connection lost");
    else if (reply->type == RL_REPLY_INTEGER)
        snprintf(why, sizeof(why), "%lld of %d replicas acknowledged the write within %d ms", reply->integer, want,
                 timeout_ms);
    else snprintf(why, sizeof(why), "WAIT refused: %.*s", (int)sizeof(why) - 20, reply->type == RL_REPLY_ERROR ? reply->str : "unexpected reply");
    return rl_round_vote(r, node, RL_NODE_ERROR, why, now_ms);
}

int rl_round_expire(rl_round *r, const char *errstr, double now_ms) {
    rl_result *res = r->res;
    if (rl_round_decided(r)) return 0;
    /* Mark every silent node first, so the detail names them all, then decide. */
    for (int i = 0; i < res->nodes; i++) {
        rl_node_result *n = &res->node[i];
        if (n->state != RL_NODE_PENDING) continue;
        n->state = RL_NODE_TIMEOUT;
        snprintf(n->errstr, sizeof(n->errstr), "%s", errstr ? errstr : "timeout");
        res->failed++;
        r->pending--;
    }
    return try_decide(r, now_ms);
}

int rl_round_slot_of(const rl_round *r, const rl_reply *reply) {
    if (r->kind != RL_ROUND_ACQUIRE_SLOT || reply == NULL || reply->type != RL_REPLY_INTEGER) return 0;
    return reply->integer >= 1 && reply->integer <= r->limit ? (int)reply->integer : 0;
}
