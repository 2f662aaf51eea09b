/* client.c — the public client: nodes, operations in flight, and the pull API.
 *
 * An operation lives in a slot that is allocated once and reused. It goes
 * through phases:
 *   ROUND    its command is out on every node; replies vote (round.c);
 *   CLEANUP  (failed acquire only) release on every node the SET may have
 *            reached, waiting for those replies or the node timeout;
 *   DONE     on the done list, waiting for rl_collect / rl_wait;
 *   FREE     on the free list.
 * Each phase change bumps the slot's generation; a reply carries the
 * generation it was sent under (node.c tickets), so a late reply can never
 * vote in a later phase or a later operation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "node.h"
#include "opid.h"
#include "round.h"
#include "url.h"
#include "value.h"

enum { OP_FREE = 0, OP_ROUND, OP_CLEANUP, OP_DONE };

typedef struct rl_op {
    rl_result res;
    rl_round round;
    ev_timer timer;          /* node timeout of the current phase */
    rl_client *client;
    int slot;
    unsigned uses;           /* operations begun in this slot: the high bits of its id */
    unsigned gen;
    int phase;
    unsigned sent;           /* bit i: this phase's command was queued on node i */
    int cleanup_pending;     /* cleanup replies still awaited */
    unsigned cleanup_sent;   /* bit i: node i was sent the cleanup */
    rl_mark cleanup_out[RL_MAX_NODES];  /* where each node's cleanup ends in its output */
    rl_buf key;              /* prefix + resource */
    rl_buf cmd;              /* RESP of the current phase's command */
    struct rl_op *prev, *next;  /* done list (doubly linked) or free list (next only) */
} rl_op;

struct rl_client {
    char errstr[RL_ERR_LEN];
    rl_options opts;
    char *prefix;
    int nnodes;
    int quorum;
    int closing;
    struct ev_loop *loop;
    rl_node nodes[RL_MAX_NODES];
    char timeout_text[64];   /* "no reply within N ms" */
    rl_buf scratch;          /* EVAL fallback commands */

    rl_op **ops;             /* every slot ever allocated, by id */
    int nops, capops;
    rl_op *free_ops;
    rl_op *done_head, *done_tail;
    int ndone, inflight;

    ev_prepare flusher;      /* before the loop polls: write what was queued */
    ev_timer run_timer;      /* bounds rl_run / rl_sleep */
    int run_expired;
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
    return 0;
}

static void on_node_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr);
static void on_op_timeout(EV_P_ ev_timer *w, int revents);
static void on_run_timer(EV_P_ ev_timer *w, int revents);

/* Write what every node has queued: one write per node for all the commands
 * begun or re-sent since the last flush. */
static void flush_all(rl_client *c) {
    for (int i = 0; i < c->nnodes; i++) rl_node_flush(&c->nodes[i]);
}

static void on_prepare(EV_P_ ev_prepare *w, int revents) {
    (void)loop;
    (void)revents;
    flush_all(w->data);
}

rl_client *rl_client_new(const char *const *urls, int nurls, const rl_options *opts, char *err,
                         size_t errlen) {
    char dummy[RL_ERR_LEN];
    if (err == NULL) err = dummy, errlen = sizeof(dummy);
    rl_options defaults;
    rl_options_init(&defaults);
    if (opts == NULL) opts = &defaults;
    if (urls == NULL || nurls <= 0) return snprintf(err, errlen, "no servers given"), NULL;
    if (nurls > RL_MAX_NODES) return snprintf(err, errlen, "too many servers (%d; at most %d)", nurls, RL_MAX_NODES), NULL;
    if (check_options(opts, nurls, err, errlen) != 0) return NULL;

    rl_url parsed[RL_MAX_NODES];
    for (int i = 0; i < nurls; i++) {
        char why[RL_ERR_LEN];
        if (rl_url_parse(urls[i], &parsed[i], why, sizeof(why)) != 0)
            return snprintf(err, errlen, "server %d: %s", i + 1, why), NULL;
        for (int j = 0; j < i; j++)
            if (rl_url_same_server(&parsed[i], &parsed[j]))
                return snprintf(err, errlen, "servers %d and %d are the same server (%s): one server would vote twice",
                                j + 1, i + 1, parsed[i].name), NULL;
    }

    rl_client *c = calloc(1, sizeof(*c));
    if (c == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    c->opts = *opts;
    c->prefix = malloc(opts->prefix_len + 1);
    c->loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (c->prefix == NULL || c->loop == NULL) {
        free(c->prefix);
        if (c->loop) ev_loop_destroy(c->loop);
        free(c);
        return snprintf(err, errlen, "out of memory (or no event loop backend)"), NULL;
    }
    memcpy(c->prefix, opts->prefix_len ? opts->prefix : "", opts->prefix_len);
    c->prefix[opts->prefix_len] = '\0';
    c->opts.prefix = c->prefix;
    c->nnodes = nurls;
    c->quorum = opts->quorum ? opts->quorum : nurls / 2 + 1;
    snprintf(c->timeout_text, sizeof(c->timeout_text), "no reply within %d ms", opts->node_timeout_ms);
    ev_timer_init(&c->run_timer, on_run_timer, 0., 0.);
    c->run_timer.data = c;
    ev_prepare_init(&c->flusher, on_prepare);
    c->flusher.data = c;
    ev_prepare_start(c->loop, &c->flusher);
    ev_unref(c->loop); /* the flusher alone does not keep the loop running */

    for (int i = 0; i < nurls; i++) rl_node_init(&c->nodes[i], &parsed[i], i, c->loop, &c->opts, on_node_reply, c, c->nodes, nurls);
    /* Every name is looked up at once and waited for together, so N slow
     * names cost one connect_timeout, not N. Rounds never wait for a lookup. */
    for (int i = 0; i < nurls; i++) rl_node_resolve(&c->nodes[i]);
    double deadline = rl_now_ms() + opts->connect_timeout_ms;
    for (int i = 0; i < nurls; i++) rl_node_start(&c->nodes[i], deadline);
    return c;
}

void rl_client_free(rl_client *c) {
    if (c == NULL) return;
    c->closing = 1;
    for (int i = 0; i < c->nnodes; i++) rl_node_close(&c->nodes[i]);
    for (int i = 0; i < c->nops; i++) {
        ev_timer_stop(c->loop, &c->ops[i]->timer);
        rl_buf_free(&c->ops[i]->key);
        rl_buf_free(&c->ops[i]->cmd);
        free(c->ops[i]);
    }
    ev_timer_stop(c->loop, &c->run_timer);
    ev_ref(c->loop);
    ev_prepare_stop(c->loop, &c->flusher);
    free(c->ops);
    rl_buf_free(&c->scratch);
    ev_loop_destroy(c->loop);
    free(c->prefix);
    free(c);
}

int rl_client_nodes(const rl_client *c) {
    return c->nnodes;
}

const char *rl_client_node_name(const rl_client *c, int i) {
    return i >= 0 && i < c->nnodes ? c->nodes[i].url.name : NULL;
}

int rl_client_quorum(const rl_client *c) {
    return c->quorum;
}

const char *rl_client_errstr(const rl_client *c) {
    return c->errstr;
}

/* ---- operation slots ---- */

static rl_op *op_alloc(rl_client *c) {
    rl_op *op = c->free_ops;
    if (op) {
        c->free_ops = op->next;
        return op;
    }
    if (c->nops == RL_OPID_MAX_SLOTS) return NULL;
    if (c->nops == c->capops) {
        int cap = c->capops ? c->capops * 2 : 16;
        rl_op **ops = realloc(c->ops, (size_t)cap * sizeof(*ops));
        if (!ops) return NULL;
        c->ops = ops;
        c->capops = cap;
    }
    op = calloc(1, sizeof(*op));
    if (!op) return NULL;
    op->client = c;
    op->slot = c->nops;
    ev_timer_init(&op->timer, on_op_timeout, 0., 0.);
    op->timer.data = op;
    c->ops[c->nops++] = op;
    return op;
}

static void done_unlink(rl_client *c, rl_op *op) {
    if (op->prev) op->prev->next = op->next;
    else c->done_head = op->next;
    if (op->next) op->next->prev = op->prev;
    else c->done_tail = op->prev;
    op->prev = op->next = NULL;
    c->ndone--;
}

static void op_free(rl_client *c, rl_op *op) {
    op->phase = OP_FREE;
    op->next = c->free_ops;
    c->free_ops = op;
}

static void start_timer(rl_client *c, rl_op *op) {
    ev_timer_set(&op->timer, c->opts.node_timeout_ms / 1000.0, 0.);
    ev_timer_start(c->loop, &op->timer);
}

/* The operation is finished: hand it to the done list. */
static void op_complete(rl_client *c, rl_op *op) {
    ev_timer_stop(c->loop, &op->timer);
    op->gen++;
    op->phase = OP_DONE;
    op->prev = c->done_tail;
    op->next = NULL;
    if (c->done_tail) c->done_tail->next = op;
    else c->done_head = op;
    c->done_tail = op;
    c->ndone++;
    c->inflight--;
}

/* A failed acquire: release on every node the SET may have reached. A node
 * that answered "taken" holds another value, never ours, so it is skipped.
 * If the release cannot even be encoded (out of memory), the result says so
 * on every node it was meant for: the key stays there until its ttl. */
static void op_start_cleanup(rl_client *c, rl_op *op) {
    op->gen++;
    op->phase = OP_CLEANUP;
    op->cleanup_pending = 0;
    op->cleanup_sent = 0;
    int encoded = rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, op->res.value) == 0;
    rl_ticket t = {op->slot, op->gen, RL_OP_RELEASE, rl_now_ms(), 0, 0};
    for (int i = 0; i < c->nnodes; i++) {
        rl_node_result *n = &op->res.node[i];
        if (!(op->sent & (1u << i)) || n->state == RL_NODE_TAKEN) continue;
        if (encoded && rl_node_send(&c->nodes[i], op->cmd.data, op->cmd.len, t) == 0) {
            op->cleanup_pending++;
            op->cleanup_sent |= 1u << i;
            op->cleanup_out[i] = rl_node_mark(&c->nodes[i]);
        } else if (n->errstr[0] == '\0') {
            /* keep a failed vote's own reason; otherwise say why the key may stay */
            snprintf(n->errstr, sizeof(n->errstr), "%s", encoded ? "cleanup not sent: node down" : "cleanup not sent: out of memory");
        }
    }
    if (op->cleanup_pending > 0) start_timer(c, op);
}

/* A healthy node answers within the node timeout. One that did not, in a
 * round it was sent, may be out of step (a reply lost in flight shifts the
 * stream for good: each reply then answers the command before its own), may
 * hang (the stall watchdog resets it), or may be working through a backlog (a
 * large batch): a step check tells them apart without resetting a backlog,
 * which would throw away what is queued behind it (the cleanups of failed
 * acquires) while the commands already sent still run. A node left pending by
 * an early decision says nothing either way. */
static void check_late_nodes(rl_client *c, const rl_op *op) {
    for (int i = 0; i < c->nnodes; i++)
        if ((op->sent & (1u << i)) && op->res.node[i].state == RL_NODE_TIMEOUT) rl_node_check_step(&c->nodes[i]);
}

/* The round is decided. */
static void op_round_decided(rl_client *c, rl_op *op) {
    ev_timer_stop(c->loop, &op->timer);
    check_late_nodes(c, op);
    if (op->res.op == RL_OP_ACQUIRE && op->res.status != RL_STATUS_OK) {
        op_start_cleanup(c, op);
        if (op->cleanup_pending > 0) return;
    }
    op_complete(c, op);
}

static int is_noscript(const rl_reply *r) {
    return r && r->type == RL_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* The node has flushed its scripts: send the script itself (EVAL) instead. */
static int resend_as_eval(rl_client *c, rl_op *op, int node, rl_ticket t) {
    int kind = t.kind;
    int rc = kind == RL_OP_RELEASE
                 ? rl_cmd_release(&c->scratch, 0, op->key.data, op->key.len, op->res.value)
                 : rl_cmd_extend(&c->scratch, 0, op->key.data, op->key.len, op->res.value, op->round.ttl_ms);
    if (rc != 0) return -1;
    t.sent_ms = rl_now_ms();
    t.eval = 1;
    return rl_node_send(&c->nodes[node], c->scratch.data, c->scratch.len, t);
}

static void on_node_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    rl_client *c = owner;
    if (c->closing || t.slot < 0 || t.slot >= c->nops) return;
    if (reply && !rl_reply_fits(t.kind, reply)) {
        /* Out of step: this reply answers some other command. Nothing on
         * this connection can be trusted any more. */
        rl_node_reset(&c->nodes[node], RL_OUT_OF_STEP);
        reply = NULL;
        errstr = c->nodes[node].errstr;
    }
    rl_op *op = c->ops[t.slot];
    if (op->gen != t.gen) {
        /* A late reply to an earlier phase or operation. A late NOSCRIPT has
         * no round left to fall back to EVAL for (which would have loaded
         * the script): load the scripts, for every later command. */
        if (is_noscript(reply)) rl_node_load_scripts(&c->nodes[node]);
        return;
    }
    /* A script the node does not know is sent as EVAL, once. (NOSCRIPT to a
     * SET is just a failed vote: there is no script to send.) */
    if (is_noscript(reply) && t.kind != RL_OP_ACQUIRE && !t.eval && resend_as_eval(c, op, node, t) == 0) return;
    if (op->phase == OP_ROUND) {
        int decided;
        if (is_noscript(reply) && t.eval) {
            /* The script itself was refused as unknown: a node that cannot
             * run it fails its vote, without another try. */
            char why[RL_NODE_ERR_LEN];
            snprintf(why, sizeof(why), "NOSCRIPT after EVAL: %.*s", (int)sizeof(why) - 22, reply->str);
            decided = rl_round_vote(&op->round, node, RL_NODE_ERROR, why, rl_now_ms());
        } else {
            decided = rl_round_reply(&op->round, node, reply, errstr, rl_now_ms());
        }
        if (decided) op_round_decided(c, op);
    } else if (op->phase == OP_CLEANUP) {
        if (--op->cleanup_pending == 0) op_complete(c, op);
    }
}

/* Has every node that was sent the cleanup been handed its bytes (or lost
 * the connection)? A cleanup that times out is done only then: the caller
 * may stop driving the client once it has the result, and the release must
 * not be left in our buffer while the SET it undoes is on the node. */
static int cleanup_out(rl_client *c, const rl_op *op) {
    for (int i = 0; i < c->nnodes; i++)
        if ((op->cleanup_sent & (1u << i)) && !rl_node_passed(&c->nodes[i], op->cleanup_out[i])) return 0;
    return 1;
}

static void on_op_timeout(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_op *op = w->data;
    rl_client *c = op->client;
    if (op->phase == OP_ROUND) {
        rl_round_expire(&op->round, c->timeout_text, rl_now_ms());
        op_round_decided(c, op);
    } else if (op->phase == OP_CLEANUP) {
        /* A connection still waiting for its setup has sent neither the SET
         * nor the cleanup: drop it rather than wait, so neither goes out
         * later while nobody drives the client. Its tickets are answered at
         * once, which may complete this operation. */
        unsigned gen = op->gen;
        for (int i = 0; i < c->nnodes; i++)
            if (op->cleanup_sent & (1u << i))
                rl_node_drop_if_unready(&c->nodes[i], "connection reset: no answer to its setup (AUTH/SELECT/INFO) in time");
        if (op->phase != OP_CLEANUP || op->gen != gen) return;
        if (cleanup_out(c, op)) op_complete(c, op);
        else start_timer(c, op); /* still in our buffer: a socket that was full */
    }
}

/* ---- beginning operations ---- */

static int begin(rl_client *c, int kind, const char *resource, size_t len, const char *value, int ttl_ms) {
    if (resource == NULL || len == 0)
        return snprintf(c->errstr, sizeof(c->errstr), "resource must be a non-empty string"), RL_ERR;
    if (kind != RL_OP_RELEASE && ttl_ms <= 0)
        return snprintf(c->errstr, sizeof(c->errstr), "ttl must be > 0 ms (got %d)", ttl_ms), RL_ERR;
    if (kind != RL_OP_ACQUIRE && (value == NULL || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN))
        return snprintf(c->errstr, sizeof(c->errstr), "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    rl_op *op = op_alloc(c);
    if (op == NULL && c->nops == RL_OPID_MAX_SLOTS)
        return snprintf(c->errstr, sizeof(c->errstr), "too many operations in flight (%d)", RL_OPID_MAX_SLOTS), RL_ERR;
    if (op == NULL) return snprintf(c->errstr, sizeof(c->errstr), "out of memory"), RL_ERR;

    /* key = prefix .. resource */
    op->cmd.len = 0;
    size_t plen = c->opts.prefix_len;
    if (op->key.cap < plen + len) {
        char *p = realloc(op->key.data, plen + len);
        if (!p) goto oom;
        op->key.data = p;
        op->key.cap = plen + len;
    }
    memcpy(op->key.data, c->prefix, plen);
    memcpy(op->key.data + plen, resource, len);
    op->key.len = plen + len;

    int rc;
    if (kind == RL_OP_ACQUIRE) {
        if (rl_value_generate(op->res.value) != 0) {
            snprintf(c->errstr, sizeof(c->errstr), "getrandom failed: no randomness for a lock value");
            op_free(c, op);
            return RL_ERR;
        }
        rc = rl_cmd_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms);
    } else {
        memcpy(op->res.value, value, RL_VALUE_LEN);
        op->res.value[RL_VALUE_LEN] = '\0';
        rc = kind == RL_OP_RELEASE ? rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, value)
                                   : rl_cmd_extend(&op->cmd, 1, op->key.data, op->key.len, value, ttl_ms);
    }
    if (rc != 0) goto oom;

    op->uses++;
    op->res.id = rl_opid_make(op->uses, op->slot);
    op->gen++;
    op->phase = OP_ROUND;
    op->sent = 0;
    c->inflight++;
    ev_now_update(c->loop);
    double now = rl_now_ms();
    rl_round_start(&op->round, &op->res, kind, c->nnodes, c->quorum, ttl_ms, c->opts.drift_factor, now);
    start_timer(c, op);
    rl_ticket t = {op->slot, op->gen, kind, now, 0, 0};
    for (int i = 0; i < c->nnodes && op->phase == OP_ROUND; i++) {
        if (rl_node_send(&c->nodes[i], op->cmd.data, op->cmd.len, t) == 0) {
            op->sent |= 1u << i;
        } else if (rl_round_vote(&op->round, i, RL_NODE_ERROR, c->nodes[i].errstr, rl_now_ms())) {
            op_round_decided(c, op);
        }
    }
    return op->res.id;

oom:
    snprintf(c->errstr, sizeof(c->errstr), "out of memory");
    op_free(c, op);
    return RL_ERR;
}

int rl_begin_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    return begin(c, RL_OP_ACQUIRE, resource, len, NULL, ttl_ms);
}

int rl_begin_release(rl_client *c, const char *resource, size_t len, const char *value) {
    return begin(c, RL_OP_RELEASE, resource, len, value, 0);
}

int rl_begin_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms) {
    return begin(c, RL_OP_EXTEND, resource, len, value, ttl_ms);
}

/* ---- driving and collecting ---- */

static void on_run_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    ((rl_client *)w->data)->run_expired = 1;
}

static void arm_run_timer(rl_client *c, int ms) {
    c->run_expired = 0;
    ev_now_update(c->loop);
    ev_timer_set(&c->run_timer, ms / 1000.0, 0.);
    ev_timer_start(c->loop, &c->run_timer);
}

/* Every way of driving the loop ends with a flush, so commands queued by the
 * last replies (cleanups, re-sends) are on their way while the caller is not
 * driving it. */
int rl_run(rl_client *c, int timeout_ms) {
    if (timeout_ms == 0 || c->ndone > 0 || (timeout_ms < 0 && c->inflight == 0)) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        if (timeout_ms > 0) arm_run_timer(c, timeout_ms);
        else c->run_expired = 0;
        while (c->ndone == 0 && !c->run_expired) ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
    flush_all(c);
    return c->ndone;
}

void rl_sleep(rl_client *c, int ms) {
    if (ms <= 0) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        arm_run_timer(c, ms);
        while (!c->run_expired) ev_run(c->loop, EVRUN_ONCE);
    }
    flush_all(c);
}

static void copy_result(const rl_op *op, rl_result *out) {
    size_t head = offsetof(rl_result, node);
    memcpy(out, &op->res, head + (size_t)op->res.nodes * sizeof(rl_node_result));
}

int rl_collect(rl_client *c, rl_result *out) {
    rl_op *op = c->done_head;
    if (op == NULL) return 0;
    done_unlink(c, op);
    copy_result(op, out);
    op_free(c, op);
    return 1;
}

/* The operation id names, or NULL if it is not in flight (never begun, or
 * already collected). */
static rl_op *op_of(rl_client *c, int id) {
    if (id < 0 || rl_opid_slot(id) >= c->nops) return NULL;
    rl_op *op = c->ops[rl_opid_slot(id)];
    return op->phase != OP_FREE && op->res.id == id ? op : NULL;
}

/* The latest moment worth waiting for a node of op whose command is still
 * held behind the setup of a connection begun less than a node timeout ago
 * (the replies to AUTH/SELECT/INFO are due by then), or 0 if there is none. */
static double held_until(rl_client *c, const rl_op *op) {
    double until = 0;
    for (int i = 0; i < c->nnodes; i++) {
        double since = op->sent & (1u << i) ? rl_node_held_since(&c->nodes[i]) : 0;
        if (since > 0 && since + c->opts.node_timeout_ms > until) until = since + c->opts.node_timeout_ms;
    }
    return until;
}

/* A blocking call returns once its operation is done. A command held on a
 * fresh connection until its setup is answered would otherwise wait for the
 * caller's next call to go out (the caller may not make one for a long
 * time): give such setups what is left of their node timeout. A connection
 * older than that (a stalled node) costs nothing. */
static void settle(rl_client *c, const rl_op *op) {
    double until;
    while ((until = held_until(c, op)) > 0) {
        double left = until - rl_now_ms();
        if (left <= 0) break;
        arm_run_timer(c, (int)left + 1);
        ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
}

int rl_wait(rl_client *c, int id, rl_result *out) {
    rl_op *op = op_of(c, id);
    if (op == NULL) {
        snprintf(c->errstr, sizeof(c->errstr), "no operation %d in flight", id);
        return RL_ERR;
    }
    while (op->phase != OP_DONE) ev_run(c->loop, EVRUN_ONCE);
    settle(c, op);
    flush_all(c);
    done_unlink(c, op);
    copy_result(op, out);
    op_free(c, op);
    return RL_OK;
}

static int finish(rl_client *c, int id, rl_result *out) {
    return id < 0 ? RL_ERR : rl_wait(c, id, out);
}

int rl_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_acquire(c, resource, len, ttl_ms), out);
}

int rl_release(rl_client *c, const char *resource, size_t len, const char *value, rl_result *out) {
    return finish(c, rl_begin_release(c, resource, len, value), out);
}

int rl_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_extend(c, resource, len, value, ttl_ms), out);
}
