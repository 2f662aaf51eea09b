/* engine.c — Redlock without I/O: operations, their phases, and the
 * per-node command streams (stream.c), driven through redlock.h's
 * rl_engine_* functions with the time as an argument.
 *
 * An operation lives in a slot that is allocated once and reused. It goes
 * through phases:
 *   ROUND    its command is queued on every node; replies vote (round.c)
 *            until the round is decided: at quorum, or once quorum is out of
 *            reach, or at the node timeout. The result is then ready (on the
 *            done list) and the caller may take it; what is still owed is the
 *            operation's tail, served without the caller:
 *   TAIL     replies to the round's command still owed by nodes slower than
 *            the quorum: each still pairs with its command, and a NOSCRIPT
 *            still gets its EVAL; they no longer change the result. Ends when
 *            all are in, or at the round's node timeout (a node late past it
 *            gets its step checked, as in a round that timed out);
 *   CLEANUP  (failed acquire) the release on every node the SET may have
 *            reached, until those replies are in or the node timeout;
 * A fenced acquire has two rounds: its grant (SET NX PX + INCR), then, if
 * granted, a commit of its token; the result is ready when the commit is
 * decided (the grant's tail is dropped: its late replies are ignored).
 *   QUIET    nothing owed; the slot waits for its result to be taken;
 *   FREE     on the free list.
 * A slot is freed once its result is taken and it is QUIET. Each phase
 * change bumps the slot's generation; a reply carries the generation it was
 * sent under (its ticket), so a late reply can never vote in a later phase
 * or a later operation. Each phase's deadline sits in a heap keyed by slot.
 * The keep-alive schedule (keep.c) begins rounds of its own here: their
 * results go back to it, never to the driver. Hand-off's subscriptions are
 * substream.c's: the engine hands it the links N .. 2N-1 (a node's
 * subscriber connection) and its part of the time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "deadlines.h"
#include "engine.h"
#include "opid.h"
#include "round.h"
#include "stream.h"
#include "substream.h"
#include "value.h"

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
    unsigned sent;           /* bit i: the first round's command went to node i (not if its connection ended first) */
    unsigned owed;           /* bit i: node i still owes a reply to this phase's command */
    unsigned cleanup_sent;   /* bit i: node i was sent the cleanup */
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

/* Draw w's id: unique, not secret, so the jitter generator will do (it works
 * without getrandom): 64 random bits as hex. */
static void draw_waiter_id(rl_waiter *w) {
    w->generation = rl_fork_generation();
    unsigned long long bits = (unsigned long long)(rl_random() * 4294967296.0) << 32 |
                              (unsigned long long)(rl_random() * 4294967296.0);
    for (int i = 0; i < RL_WAITER_ID_LEN; i++, bits >>= 4) w->id[i] = "0123456789abcdef"[bits & 15];
    w->id[RL_WAITER_ID_LEN] = '\0';
}

struct rl_engine {
    char errstr[RL_ERR_LEN];
    rl_options opts;
    char *prefix;
    int nnodes;
    int quorum;
    double now;              /* the latest time a caller gave (time never goes back) */
    rl_url urls[RL_MAX_NODES];
    rl_stream nodes[RL_MAX_NODES];
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
};

void rl_options_init(rl_options *o) {
    memset(o, 0, sizeof(*o));
    o->node_timeout_ms = 50;
    o->connect_timeout_ms = 1000;
    o->reconnect_min_ms = 50;
    o->reconnect_max_ms = 1000;
    o->stall_reset_ms = 500;
    o->quorum = 0;
    o->drift_factor = 0.01;
    o->prefix = "";
    o->prefix_len = 0;
    o->tls.verify = 1;
}

static int check_options(const rl_options *o, int n, char *err, size_t errlen) {
    int majority = n / 2 + 1;
    if (o->node_timeout_ms <= 0) return snprintf(err, errlen, "node_timeout must be > 0 ms"), -1;
    if (o->connect_timeout_ms <= 0) return snprintf(err, errlen, "connect_timeout must be > 0 ms"), -1;
    if (o->stall_reset_ms <= 0) return snprintf(err, errlen, "stall_reset must be > 0 ms"), -1;
    if (o->reconnect_min_ms <= 0 || o->reconnect_max_ms < o->reconnect_min_ms)
        return snprintf(err, errlen, "reconnect delays must satisfy 0 < min <= max"), -1;
    if (!(o->drift_factor >= 0 && o->drift_factor < 1))
        return snprintf(err, errlen, "drift_factor must be in [0, 1)"), -1;
    if (o->quorum != 0 && (o->quorum < majority || o->quorum > n))
        return snprintf(err, errlen, "quorum must be between %d (a majority of %d) and %d", majority, n, n), -1;
    if (o->prefix_len > 0 && o->prefix == NULL) return snprintf(err, errlen, "prefix is NULL"), -1;
    if (o->prefix_len > RL_MAX_KEY_LEN) return snprintf(err, errlen, "prefix is longer than a key may be"), -1;
    if (rl_key_in_namespace(o->prefix, o->prefix_len, "", 0))
        return snprintf(err, errlen, "prefix starts with \"" RL_RESERVED_PREFIX "\", where redlock keeps its own keys"), -1;
    return 0;
}

static void on_node_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr);

/* The time of this call: never before the last one. */
static double clock_at(rl_engine *e, double now_ms) {
    if (now_ms > e->now) e->now = now_ms;
    return e->now;
}

rl_engine *rl_engine_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen) {
    char dummy[RL_ERR_LEN];
    if (err == NULL) err = dummy, errlen = sizeof(dummy);
    rl_options defaults;
    rl_options_init(&defaults);
    if (opts == NULL) opts = &defaults;
    if (urls == NULL || nurls <= 0) return snprintf(err, errlen, "no servers given"), NULL;
    if (nurls > RL_MAX_NODES) return snprintf(err, errlen, "too many servers (%d; at most %d)", nurls, RL_MAX_NODES), NULL;
    if (check_options(opts, nurls, err, errlen) != 0) return NULL;

    rl_engine *e = calloc(1, sizeof(*e));
    if (e == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    for (int i = 0; i < nurls; i++) {
        char why[RL_ERR_LEN];
        if (urls[i] == NULL || rl_url_parse(urls[i], &e->urls[i], why, sizeof(why)) != 0) {
            snprintf(err, errlen, "server %d: %s", i + 1, urls[i] ? why : "NULL");
            free(e);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (rl_url_same_server(&e->urls[i], &e->urls[j])) {
                snprintf(err, errlen, "servers %d and %d are the same server (%s): one server would vote twice",
                         j + 1, i + 1, e->urls[i].name);
                free(e);
                return NULL;
            }
    }
    e->opts = *opts;
    e->prefix = malloc(opts->prefix_len + 1);
    if (e->prefix == NULL) {
        free(e);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    draw_waiter_id(&e->waiter);
    memcpy(e->prefix, opts->prefix_len ? opts->prefix : "", opts->prefix_len);
    e->prefix[opts->prefix_len] = '\0';
    e->opts.prefix = e->prefix;
    e->nnodes = nurls;
    e->quorum = opts->quorum ? opts->quorum : nurls / 2 + 1;
    snprintf(e->timeout_text, sizeof(e->timeout_text), "no reply within %d ms", opts->node_timeout_ms);
    for (int i = 0; i < nurls; i++)
        rl_stream_init(&e->nodes[i], &e->urls[i], i, &e->opts, on_node_reply, e, e->nodes, nurls);
    rl_keep_init(&e->keep);
    if (rl_subs_init(&e->subs, e->urls, nurls, &e->opts) != 0) {
        rl_engine_free(e);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    return e;
}

void rl_engine_free(rl_engine *e) {
    if (e == NULL) return;
    for (int i = 0; i < e->nnodes; i++) rl_stream_free(&e->nodes[i]);
    rl_subs_free(&e->subs);
    for (int i = 0; i < e->nops; i++) {
        rl_buf_free(&e->ops[i]->key);
        rl_buf_free(&e->ops[i]->cmd);
        free(e->ops[i]);
    }
    free(e->ops);
    rl_deadlines_free(&e->deadlines);
    rl_keep_free(&e->keep);
    rl_buf_free(&e->scratch);
    free(e->prefix);
    free(e);
}

int rl_engine_nodes(const rl_engine *e) {
    return e->nnodes;
}

/* The node of link k (k, or k - N for a subscriber link), or -1. */
static int node_at(const rl_engine *e, int k) {
    return k >= 0 && k < e->nnodes ? k : k >= e->nnodes && k < 2 * e->nnodes ? k - e->nnodes : -1;
}

const char *rl_engine_node_name(const rl_engine *e, int i) {
    return (i = node_at(e, i)) >= 0 ? e->urls[i].name : NULL;
}

const char *rl_engine_node_host(const rl_engine *e, int i) {
    if ((i = node_at(e, i)) < 0) return NULL;
    return e->urls[i].kind == RL_URL_UNIX ? e->urls[i].path : e->urls[i].host;
}

int rl_engine_node_tls(const rl_engine *e, int i) {
    return (i = node_at(e, i)) >= 0 && e->urls[i].kind == RL_URL_TCP && e->urls[i].tls;
}

int rl_engine_node_port(const rl_engine *e, int i) {
    return (i = node_at(e, i)) >= 0 && e->urls[i].kind == RL_URL_TCP ? e->urls[i].port : 0;
}

rl_subs *rl_engine_subs(const rl_engine *e, double *now_ms) {
    rl_engine *m = (rl_engine *)e; /* engines live on the heap: the const may go */
    if (now_ms) *now_ms = clock_at(m, *now_ms);
    return &m->subs;
}

int rl_engine_quorum(const rl_engine *e) {
    return e->quorum;
}

const char *rl_engine_errstr(const rl_engine *e) {
    return e->errstr;
}

/* ---- operation slots ---- */

static rl_op *op_alloc(rl_engine *e) {
    rl_op *op = e->free_ops;
    if (op) {
        e->free_ops = op->next;
        return op;
    }
    if (e->nops == RL_OPID_MAX_SLOTS) return NULL;
    if (e->nops == e->capops) {
        int cap = e->capops ? e->capops * 2 : 16;
        rl_op **ops = realloc(e->ops, (size_t)cap * sizeof(*ops));
        if (!ops) return NULL;
        e->ops = ops;
        e->capops = cap;
    }
    if (rl_deadlines_reserve(&e->deadlines, e->nops + 1) != 0) return NULL;
    op = calloc(1, sizeof(*op));
    if (!op) return NULL;
    op->slot = e->nops;
    e->ops[e->nops++] = op;
    return op;
}

static void done_unlink(rl_engine *e, rl_op *op) {
    if (op->prev) op->prev->next = op->next;
    else e->done_head = op->next;
    if (op->next) op->next->prev = op->prev;
    else e->done_tail = op->prev;
    op->prev = op->next = NULL;
    e->ndone--;
}

static void op_free(rl_engine *e, rl_op *op) {
    op->phase = OP_FREE;
    op->next = e->free_ops;
    e->free_ops = op;
}

/* The current phase must end by a node timeout from now. */
static void start_timer(rl_engine *e, rl_op *op) {
    rl_deadlines_set(&e->deadlines, op->slot, e->now + e->opts.node_timeout_ms);
}

/* The round is decided: its result goes on the done list for the caller
 * (a keep-alive round's, to the schedule). */
static void op_publish(rl_engine *e, rl_op *op) {
    op->res.token = op->round.kind == RL_ROUND_COMMIT && op->res.status == RL_STATUS_OK ? op->token : 0;
    if (op->kept.entry >= 0) {
        e->inflight--;
        rl_keep_result(&e->keep, op->kept, &op->res, e->now);
        return;
    }
    op->prev = e->done_tail;
    op->next = NULL;
    if (e->done_tail) e->done_tail->next = op;
    else e->done_head = op;
    e->done_tail = op;
    e->ndone++;
    e->inflight--;
}

/* Nothing more is owed to the operation: replies still to come are late,
 * and are ignored. The slot is freed if its result was taken. */
static void op_quiet(rl_engine *e, rl_op *op) {
    rl_deadlines_remove(&e->deadlines, op->slot);
    if (op->phase == OP_TAIL || op->phase == OP_CLEANUP) e->tails--;
    op->gen++;
    op->phase = OP_QUIET;
    op->owed = 0;
    if (op->taken) op_free(e, op);
}

/* The cleanup could not go out to node i on the connection the SET went
 * out on (that connection ended first, with the SET applied or not): keep
 * the release for the node's next connection (EVAL, whatever scripts that
 * node has then). Unless the SET itself never went out. Return 0, or -1 if
 * it cannot be kept. */
static int redo_cleanup(rl_engine *e, rl_op *op, int i) {
    if (!(op->sent & (1u << i))) return 0;
    if (rl_cmd_release(&e->scratch, 0, op->key.data, op->key.len, op->res.value, 1) != 0) return -1;
    return rl_stream_redo(&e->nodes[i], e->scratch.data, e->scratch.len, e->now);
}

/* A failed acquire: release on every node the SET may have reached. A node
 * that answered "taken" holds another value, never ours, so it is skipped.
 * A node that is down now (its connection ended after the SET went out)
 * gets the release on its next connection (redo_cleanup). If the release
 * cannot even be encoded or kept (out of memory), the result says so on
 * every node it was meant for: the key stays there until its ttl. */
static void op_start_cleanup(rl_engine *e, rl_op *op) {
    op->gen++;
    op->phase = OP_CLEANUP;
    op->owed = 0;
    op->cleanup_sent = 0;
    int encoded = rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, op->res.value, 1) == 0;
    rl_ticket t = {op->slot, op->gen, RL_OP_RELEASE, e->now, 0, 0, 0};
    for (int i = 0; i < e->nnodes; i++) {
        rl_node_result *n = &op->res.node[i];
        if (!(op->sent & (1u << i)) || n->state == RL_NODE_TAKEN) continue;
        if (encoded && rl_stream_send(&e->nodes[i], op->cmd.data, op->cmd.len, t, e->now) == 0) {
            op->owed |= 1u << i;
            op->cleanup_sent |= 1u << i;
            op->cleanup_out[i] = rl_stream_mark(&e->nodes[i]);
        } else if ((!encoded || redo_cleanup(e, op, i) != 0) && n->errstr[0] == '\0') {
            /* keep a failed vote's own reason; otherwise say why the key may stay */
            snprintf(n->errstr, sizeof(n->errstr), "%s", encoded ? "cleanup not sent: node down, no room to keep it" : "cleanup not sent: out of memory");
        }
    }
    e->tails++;
    if (op->owed) start_timer(e, op);
    else op_quiet(e, op);
}

/* A healthy node answers within the node timeout. One that did not, to a
 * command it was sent, may be out of step (a reply lost in flight shifts the
 * stream for good: each reply then answers the command before its own), may
 * hang (the stall watchdog resets it), or may be working through a backlog (a
 * large batch): a step check tells them apart without resetting a backlog,
 * which would throw away what is queued behind it (the cleanups of failed
 * acquires) while the commands already sent still run. */
static void check_late_nodes(rl_engine *e, const rl_op *op) {
    for (int i = 0; i < e->nnodes; i++)
        if (op->owed & (1u << i)) rl_stream_check_step(&e->nodes[i], e->now);
}

static void send_round(rl_engine *e, rl_op *op, int kind, double start_ms, int first);

/* The round is decided; timed_out: by its node timeout, so the nodes still
 * owing a reply are late (a late reply will be ignored). Otherwise they are
 * the tail, served until the same node timeout. A granted fenced acquire
 * goes on to commit its token (the highest counter a grant returned); a
 * failed acquire goes on to its cleanup. */
static void op_round_decided(rl_engine *e, rl_op *op, int timed_out) {
    if (timed_out) check_late_nodes(e, op);
    if (op->round.kind == RL_ROUND_ACQUIRE_FENCED && op->res.status == RL_STATUS_OK) {
        op->token = op->round.top;
        if (rl_cmd_commit(&op->cmd, op->key.data, op->key.len, op->res.value, op->token) == 0) {
            send_round(e, op, RL_ROUND_COMMIT, op->round.start_ms, 0);
            return;
        }
        op->res.status = RL_STATUS_UNAVAILABLE; /* no memory for the commit: no token, no grant */
    }
    op_publish(e, op);
    if (op->res.op == RL_OP_ACQUIRE && op->res.status != RL_STATUS_OK) {
        rl_deadlines_remove(&e->deadlines, op->slot);
        op_start_cleanup(e, op);
    } else if (op->owed && !timed_out) {
        op->phase = OP_TAIL; /* the round's deadline stays */
        e->tails++;
    } else {
        op_quiet(e, op);
    }
}

static int is_noscript(const rl_reply *r) {
    return r && r->type == RL_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* The node has flushed its scripts: send the script itself (EVAL) instead. */
static int resend_as_eval(rl_engine *e, rl_op *op, int node, rl_ticket t) {
    int rc = t.kind == RL_OP_RELEASE
                 ? rl_cmd_release(&e->scratch, 0, op->key.data, op->key.len, op->res.value,
                                  op->quiet || op->phase == OP_CLEANUP)
                 : rl_cmd_extend(&e->scratch, 0, op->key.data, op->key.len, op->res.value, op->ttl_ms);
    if (rc != 0) return -1;
    t.sent_ms = e->now;
    t.eval = 1;
    return rl_stream_send(&e->nodes[node], e->scratch.data, e->scratch.len, t, e->now);
}

static void on_node_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    rl_engine *e = owner;
    if (t.slot < 0 || t.slot >= e->nops) return;
    if (reply && !rl_reply_fits(t.kind, reply)) {
        /* Out of step: this reply answers some other command. Nothing on
         * this connection can be trusted any more. */
        rl_stream_reset(&e->nodes[node], RL_OUT_OF_STEP, e->now);
        reply = NULL;
        errstr = e->nodes[node].errstr;
    }
    rl_op *op = e->ops[t.slot];
    /* A SET whose connection ended before it was written never ran: no
     * cleanup needs to reach that node later. */
    if (!reply && t.unsent && t.gen == op->set_gen) op->sent &= ~(1u << node);
    if (op->gen != t.gen) {
        /* A late reply to an earlier phase or operation. A late NOSCRIPT has
         * no round left to fall back to EVAL for (which would have loaded
         * the script): load the scripts, for every later command. */
        if (is_noscript(reply)) rl_stream_load_scripts(&e->nodes[node], e->now);
        return;
    }
    /* A script the node does not know is sent as EVAL, once, in the round
     * or its tail alike. (NOSCRIPT to a SET is just a failed vote: there is
     * no script to send; a fenced lock's scripts always go as EVAL.) */
    if (is_noscript(reply) && (t.kind == RL_OP_RELEASE || t.kind == RL_OP_EXTEND) && !t.eval &&
        resend_as_eval(e, op, node, t) == 0)
        return;
    op->owed &= ~(1u << node);
    /* The cleanup's connection ended, or its setup was given up on, before
     * the cleanup was written: keep it for the node's next connection (if
     * the SET may have run), and wait no more for its bytes to go out. */
    if (!reply && t.unsent && op->phase == OP_CLEANUP) {
        op->cleanup_sent &= ~(1u << node);
        redo_cleanup(e, op, node);
    }
    if (op->phase == OP_ROUND) {
        int decided;
        if (is_noscript(reply) && t.eval) {
            /* The script itself was refused as unknown: a node that cannot
             * run it fails its vote, without another try. */
            char why[RL_NODE_ERR_LEN];
            snprintf(why, sizeof(why), "NOSCRIPT after EVAL: %.*s", (int)sizeof(why) - 22, reply->str);
            decided = rl_round_vote(&op->round, node, RL_NODE_ERROR, why, e->now);
        } else {
            decided = rl_round_reply(&op->round, node, reply, errstr, e->now);
        }
        if (decided) op_round_decided(e, op, 0);
    } else if (op->owed == 0) {
        op_quiet(e, op); /* the tail, or the cleanup, is complete */
    }
}

/* Has every node that was sent the cleanup been handed its bytes (or lost
 * the connection)? A cleanup that times out is done only then: the caller
 * may stop driving the engine once it has the result, and the release must
 * not be left in our buffer while the SET it undoes is on the node. */
static int cleanup_out(rl_engine *e, const rl_op *op) {
    for (int i = 0; i < e->nnodes; i++)
        if ((op->cleanup_sent & (1u << i)) && !rl_stream_passed(&e->nodes[i], op->cleanup_out[i])) return 0;
    return 1;
}

/* The round's node timeout passed: every node yet to vote times out. One
 * whose connection is still being made or set up says so (and how long it
 * has been at it); the connection goes on until its connect deadline. */
static void op_expire_round(rl_engine *e, rl_op *op) {
    char why[RL_NODE_ERR_LEN];
    for (int i = 0; i < e->nnodes; i++) {
        if (op->res.node[i].state != RL_NODE_PENDING || !rl_stream_setup_text(&e->nodes[i], e->now, why, sizeof(why)))
            continue;
        if (rl_round_vote(&op->round, i, RL_NODE_TIMEOUT, why, e->now)) break;
    }
    rl_round_expire(&op->round, e->timeout_text, e->now);
    op_round_decided(e, op, 1);
}

static void op_timeout(rl_engine *e, rl_op *op) {
    if (op->phase == OP_ROUND) {
        op_expire_round(e, op);
    } else if (op->phase == OP_TAIL) {
        check_late_nodes(e, op);
        op_quiet(e, op);
    } else if (op->phase == OP_CLEANUP) {
        /* A connection whose setup is still under way has sent neither the
         * SET nor the cleanup: take back what waits behind its setup, so
         * neither goes out later while nobody drives the engine. The
         * connection itself lives on until its connect deadline. The
         * tickets are answered at once, which may complete this operation. */
        unsigned gen = op->gen;
        for (int i = 0; i < e->nnodes; i++)
            if (op->cleanup_sent & (1u << i)) rl_stream_withdraw_held(&e->nodes[i], e->now);
        if (op->phase != OP_CLEANUP || op->gen != gen) return;
        if (cleanup_out(e, op)) op_quiet(e, op);
        else start_timer(e, op); /* still in our buffer: a socket that was full */
    } else {
        rl_deadlines_remove(&e->deadlines, op->slot);
    }
}

/* ---- beginning operations ---- */

/* Start a round of kind with op->cmd on every node, its clock started at
 * start_ms; a node that cannot take it votes against at once (which may
 * decide it). first: the operation's first round, whose nodes are the ones
 * a failed acquire's cleanup goes to. */
static void send_round(rl_engine *e, rl_op *op, int kind, double start_ms, int first) {
    op->gen++;
    op->phase = OP_ROUND;
    op->owed = 0;
    rl_round_start(&op->round, &op->res, kind, e->nnodes, e->quorum, op->ttl_ms, e->opts.drift_factor, start_ms);
    start_timer(e, op);
    unsigned gen = op->gen;
    if (first) op->set_gen = gen;
    rl_ticket t = {op->slot, gen, kind, e->now, 0, 0, 0};
    for (int i = 0; i < e->nnodes && op->gen == gen && op->phase == OP_ROUND; i++) {
        if (rl_stream_send(&e->nodes[i], op->cmd.data, op->cmd.len, t, e->now) == 0) {
            if (first) op->sent |= 1u << i;
            op->owed |= 1u << i;
        } else if (rl_round_vote(&op->round, i, RL_NODE_ERROR, e->nodes[i].errstr, e->now)) {
            op_round_decided(e, op, 0);
        }
    }
}

/* How an acquire asks: SET NX PX, the fenced script, or a waiter's SET that
 * joins the queue of waiters on refusal; how a release does: waking the
 * waiters (PLAIN) or nobody (QUIET). */
enum { PLAIN, FENCED, QUEUED, QUIET };

static int begin(rl_engine *e, int kind, int variant, const char *resource, size_t len, const char *value, int ttl_ms,
                 const rl_keep_ref *kept, double now_ms) {
    if (resource == NULL || len == 0)
        return snprintf(e->errstr, sizeof(e->errstr), "resource must be a non-empty string"), RL_ERR;
    if (len > RL_MAX_KEY_LEN - e->opts.prefix_len)
        return snprintf(e->errstr, sizeof(e->errstr), "resource is longer than a key may be (512 MB with the prefix)"), RL_ERR;
    const char *reserved = rl_reserved_key(e->prefix, e->opts.prefix_len, resource, len);
    if (reserved) return snprintf(e->errstr, sizeof(e->errstr), "resource is reserved: %s", reserved), RL_ERR;
    if (kind != RL_OP_RELEASE && ttl_ms <= 0)
        return snprintf(e->errstr, sizeof(e->errstr), "ttl must be > 0 ms (got %d)", ttl_ms), RL_ERR;
    if (kind != RL_OP_ACQUIRE && (value == NULL || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN))
        return snprintf(e->errstr, sizeof(e->errstr), "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    rl_op *op = op_alloc(e);
    if (op == NULL && e->nops == RL_OPID_MAX_SLOTS)
        return snprintf(e->errstr, sizeof(e->errstr), "too many operations in flight (%d)", RL_OPID_MAX_SLOTS),
               RL_ERR_FULL;
    if (op == NULL) return snprintf(e->errstr, sizeof(e->errstr), "out of memory"), RL_ERR;

    /* key = prefix .. resource */
    op->cmd.len = 0;
    size_t plen = e->opts.prefix_len;
    if (op->key.cap < plen + len) {
        char *p = realloc(op->key.data, plen + len);
        if (!p) goto oom;
        op->key.data = p;
        op->key.cap = plen + len;
    }
    memcpy(op->key.data, e->prefix, plen);
    memcpy(op->key.data + plen, resource, len);
    op->key.len = plen + len;

    int rc;
    if (kind == RL_OP_ACQUIRE) {
        if (rl_value_generate(op->res.value) != 0) {
            snprintf(e->errstr, sizeof(e->errstr), "getrandom failed: no randomness for a lock value");
            op_free(e, op);
            return RL_ERR;
        }
        rc = variant == FENCED ? rl_cmd_acquire_fenced(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms)
             : variant == QUEUED
                 ? rl_cmd_acquire_queued(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms,
                                         rl_engine_waiter_id(e))
                 : rl_cmd_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms);
    } else {
        memcpy(op->res.value, value, RL_VALUE_LEN);
        op->res.value[RL_VALUE_LEN] = '\0';
        rc = kind == RL_OP_RELEASE ? rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, value, variant == QUIET)
                                   : rl_cmd_extend(&op->cmd, 1, op->key.data, op->key.len, value, ttl_ms);
    }
    if (rc != 0) goto oom;

    double now = clock_at(e, now_ms);
    op->uses++;
    op->res.id = rl_opid_make(op->uses, op->slot);
    op->kept = kept ? *kept : (rl_keep_ref){-1, 0};
    op->taken = kept != NULL; /* nobody takes a keep-alive round's result */
    op->sent = 0;
    op->ttl_ms = ttl_ms;
    op->quiet = variant == QUIET;
    e->inflight++;
    send_round(e, op, variant == FENCED ? RL_ROUND_ACQUIRE_FENCED : kind, now, 1);
    return op->res.id;

oom:
    snprintf(e->errstr, sizeof(e->errstr), "out of memory");
    op_free(e, op);
    return RL_ERR;
}

int rl_engine_begin_acquire(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, PLAIN, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_fenced(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, FENCED, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_queued(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, QUEUED, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_release(rl_engine *e, const char *resource, size_t len, const char *value, double now_ms) {
    return begin(e, RL_OP_RELEASE, PLAIN, resource, len, value, 0, NULL, now_ms);
}

int rl_engine_begin_release_quiet(rl_engine *e, const char *resource, size_t len, const char *value,
                                  double now_ms) {
    return begin(e, RL_OP_RELEASE, QUIET, resource, len, value, 0, NULL, now_ms);
}

int rl_engine_begin_extend(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                           double now_ms) {
    return begin(e, RL_OP_EXTEND, PLAIN, resource, len, value, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_kept(rl_engine *e, int kind, const char *resource, size_t len, const char *value, int ttl_ms,
                         rl_keep_ref ref, double now_ms) {
    return begin(e, kind, PLAIN, resource, len, value, ttl_ms, &ref, now_ms);
}

rl_keep *rl_engine_keeps(rl_engine *e) {
    return &e->keep;
}

double rl_engine_clock(rl_engine *e, double now_ms) {
    return clock_at(e, now_ms);
}

void rl_engine_fail(rl_engine *e, const char *why) {
    snprintf(e->errstr, sizeof(e->errstr), "%s", why);
}

const char *rl_engine_waiter_id(const rl_engine *e) {
    /* drawn again after a fork: engines live on the heap, so the const may go */
    rl_waiter *w = (rl_waiter *)&e->waiter;
    if (w->generation != rl_fork_generation()) draw_waiter_id(w);
    return w->id;
}

/* ---- what the driver reports, and what it is asked ---- */

static rl_stream *node_of(rl_engine *e, int node) {
    return node >= 0 && node < e->nnodes ? &e->nodes[node] : NULL;
}

/* The node whose subscriber link is link k, or -1 if k is no subscriber link. */
static int sub_of(const rl_engine *e, int k) {
    return k >= e->nnodes && k < 2 * e->nnodes ? k - e->nnodes : -1;
}

unsigned rl_engine_wanting(const rl_engine *e) {
    unsigned bits = 0;
    for (int i = 0; i < e->nnodes; i++) {
        if (rl_stream_wanting(&e->nodes[i])) bits |= 1u << i;
        if (rl_subs_wanting(&e->subs, i)) bits |= 1u << (e->nnodes + i);
    }
    return bits;
}

int rl_engine_node_wants(rl_engine *e, int node) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    return s ? rl_stream_take_wants(s) : j >= 0 ? rl_subs_take_wants(&e->subs, j) : 0;
}

void rl_engine_node_open(rl_engine *e, int node, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (s) rl_stream_open(s, clock_at(e, now_ms));
    else if (j >= 0) rl_subs_open(&e->subs, j, clock_at(e, now_ms));
}

int rl_engine_node_connected(rl_engine *e, int node, int fresh, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (j >= 0) return rl_subs_connected(&e->subs, j, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
    if (s == NULL || rl_stream_connected(s, fresh, clock_at(e, now_ms)) != 0) return RL_ERR;
    return RL_OK;
}

void rl_engine_node_handshaking(rl_engine *e, int node) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (s) rl_stream_handshaking(s);
    else if (j >= 0) rl_subs_handshaking(&e->subs, j);
}

void rl_engine_node_down(rl_engine *e, int node, const char *why, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (s) rl_stream_down(s, why, clock_at(e, now_ms));
    else if (j >= 0) rl_subs_down(&e->subs, j, why, clock_at(e, now_ms));
}

int rl_engine_node_detach(rl_engine *e, int node, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (j >= 0) return rl_subs_detach(&e->subs, j, clock_at(e, now_ms));
    return s ? rl_stream_detach(s, clock_at(e, now_ms)) : 0;
}

size_t rl_engine_node_output(rl_engine *e, int node, const char **data) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (data == NULL) return 0;
    return s ? rl_stream_output(s, data) : j >= 0 ? rl_subs_output(&e->subs, j, data) : 0;
}

void rl_engine_node_wrote(rl_engine *e, int node, size_t n, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (s) rl_stream_wrote(s, n, clock_at(e, now_ms));
    else if (j >= 0) rl_subs_wrote(&e->subs, j, n);
}

int rl_engine_node_feed(rl_engine *e, int node, const char *data, size_t len, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if ((s == NULL && j < 0) || (data == NULL && len > 0)) return RL_ERR;
    if (j >= 0) return rl_subs_feed(&e->subs, j, data, len, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
    return rl_stream_feed(s, data, len, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
}

void rl_engine_node_unsent(rl_engine *e, int node, long long bytes) {
    rl_stream *s = node_of(e, node);
    if (s) rl_stream_unsent(s, bytes);
}

int rl_engine_node_unanswered(const rl_engine *e, int node) {
    return node >= 0 && node < e->nnodes ? (int)e->nodes[node].ring_count : 0;
}

const char *rl_engine_node_errstr(const rl_engine *e, int node) {
    int j = sub_of(e, node);
    return node >= 0 && node < e->nnodes ? e->nodes[node].errstr : j >= 0 ? e->subs.nodes[j].errstr : NULL;
}

double rl_engine_deadline(const rl_engine *e) {
    double at = -1, d;
    if (rl_deadlines_first(&e->deadlines, &d) >= 0) at = d;
    for (int i = 0; i <= e->nnodes; i++) {
        d = i < e->nnodes ? rl_stream_deadline(&e->nodes[i]) : rl_subs_deadline(&e->subs);
        if (d > 0 && (at < 0 || d < at)) at = d;
    }
    d = rl_keep_deadline(&e->keep);
    if (d >= 0 && (at < 0 || d < at)) at = d;
    return at;
}

void rl_engine_advance(rl_engine *e, double now_ms) {
    double now = clock_at(e, now_ms), at;
    for (int i = 0; i < e->nnodes; i++) rl_stream_advance(&e->nodes[i], now);
    rl_subs_advance(&e->subs, now);
    int slot;
    while ((slot = rl_deadlines_first(&e->deadlines, &at)) >= 0 && at <= now) op_timeout(e, e->ops[slot]);
    rl_keep_advance(e, &e->keep, now);
}

/* ---- collecting ---- */

static void copy_result(const rl_op *op, rl_result *out) {
    size_t head = offsetof(rl_result, node);
    memcpy(out, &op->res, head + (size_t)op->res.nodes * sizeof(rl_node_result));
}

/* The operation id names, or NULL if it is not in flight (never begun, or
 * already collected: a tail left running belongs to nobody). */
static rl_op *op_of(const rl_engine *e, int id) {
    if (id < 0 || rl_opid_slot(id) >= e->nops) return NULL;
    rl_op *op = e->ops[rl_opid_slot(id)];
    return op->phase != OP_FREE && !op->taken && op->res.id == id ? op : NULL;
}

/* Hand a decided operation's result to the caller. Its slot is freed now,
 * or when its tail ends. */
static void op_take(rl_engine *e, rl_op *op, rl_result *out) {
    done_unlink(e, op);
    if (out != NULL) copy_result(op, out);
    op->taken = 1;
    if (op->phase == OP_QUIET) op_free(e, op);
}

int rl_engine_collect(rl_engine *e, rl_result *out) {
    rl_op *op = e->done_head;
    if (op == NULL || out == NULL) return 0;
    op_take(e, op, out);
    return 1;
}

int rl_engine_take(rl_engine *e, int id, rl_result *out) {
    rl_op *op = op_of(e, id);
    if (op == NULL) {
        snprintf(e->errstr, sizeof(e->errstr), "no operation %d in flight", id);
        return RL_ERR;
    }
    if (op->phase == OP_ROUND) return 0;
    op_take(e, op, out);
    return 1;
}

int rl_engine_finished(const rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    return op == NULL ? RL_ERR : op->phase != OP_ROUND;
}

int rl_engine_done(const rl_engine *e) {
    return e->ndone;
}

int rl_engine_inflight(const rl_engine *e) {
    return e->inflight;
}

int rl_engine_tails(const rl_engine *e) {
    return e->tails;
}

int rl_engine_unwritten(const rl_engine *e) {
    int n = 0;
    for (int i = 0; i < e->nnodes; i++) n += rl_stream_unwritten(&e->nodes[i]);
    return n;
}

int rl_engine_cleanup_unwritten(rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    return op != NULL && op->phase == OP_CLEANUP && !cleanup_out(e, op);
}

int rl_engine_first_done(const rl_engine *e) {
    return e->done_head ? e->done_head->res.id : -1;
}

double rl_engine_held_until(const rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    double until = 0;
    for (int i = 0; op && i < e->nnodes; i++) {
        double since = op->sent & (1u << i) ? rl_stream_held_since(&e->nodes[i]) : 0;
        if (since > 0 && since + e->opts.node_timeout_ms > until) until = since + e->opts.node_timeout_ms;
    }
    return until;
}
