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
 * subscriber connection) and its part of the time.
 *
 * The engine's files: this one (the engine object: options, nodes, time,
 * deadlines), links.c (the driver's calls, link by link), begin.c
 * (beginning operations), ops.c (slots and phases), collect.c (handing
 * results back); their shared state is engine_impl.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "value.h"

/* Draw w's id: unique, not secret, so the jitter generator will do (it works
 * without getrandom): 64 random bits as hex. */
static void draw_waiter_id(rl_waiter *w) {
    w->generation = rl_fork_generation();
    unsigned long long bits = (unsigned long long)(rl_random() * 4294967296.0) << 32 |
                              (unsigned long long)(rl_random() * 4294967296.0);
    for (int i = 0; i < RL_WAITER_ID_LEN; i++, bits >>= 4) w->id[i] = "0123456789abcdef"[bits & 15];
    w->id[RL_WAITER_ID_LEN] = '\0';
}

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
    if (o->replicas < 0 || o->replicas > RL_MAX_REPLICAS)
        return snprintf(err, errlen, "replicas must be from 0 to %d", RL_MAX_REPLICAS), -1;
    if (o->prefix_len > 0 && o->prefix == NULL) return snprintf(err, errlen, "prefix is NULL"), -1;
    if (o->prefix_len > RL_MAX_KEY_LEN) return snprintf(err, errlen, "prefix is longer than a key may be"), -1;
    const char *bad_label = o->label ? rl_label_refusal(o->label) : NULL;
    if (bad_label) return snprintf(err, errlen, "label %s", bad_label), -1;
    if (rl_key_in_namespace(o->prefix, o->prefix_len, "", 0))
        return snprintf(err, errlen, "prefix starts with \"" RL_RESERVED_PREFIX "\", where redlock keeps its own keys"), -1;
    return 0;
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
    e->opts = *opts; /* the shards of a cluster node are made with the URLs */
    for (int i = 0; i < nurls; i++) {
        char why[RL_ERR_LEN];
        int cluster = rl_cluster_url(urls[i]);
        if (cluster) e->nclusters++;
        if (urls[i] == NULL || (cluster ? rl_cluster_add(e, i, urls[i], why, sizeof(why))
                                        : rl_url_parse(urls[i], &e->urls[i], why, sizeof(why))) != 0) {
            snprintf(err, errlen, "server %d: %s", i + 1, urls[i] ? why : "NULL");
            rl_cluster_free(e);
            free(e);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (rl_url_same_server(&e->urls[i], &e->urls[j])) {
                snprintf(err, errlen, "servers %d and %d are the same server (%s): one server would vote twice",
                         j + 1, i + 1, e->urls[i].name);
                rl_cluster_free(e);
                free(e);
                return NULL;
            }
    }
    e->opts = *opts;
    e->prefix = malloc(opts->prefix_len + 1);
    if (e->prefix == NULL) {
        rl_cluster_free(e);
        free(e);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    draw_waiter_id(&e->waiter);
    memcpy(e->prefix, opts->prefix_len ? opts->prefix : "", opts->prefix_len);
    e->prefix[opts->prefix_len] = '\0';
    e->opts.prefix = e->prefix;
    if (opts->label) snprintf(e->label, sizeof(e->label), "%s", opts->label);
    e->opts.label = e->label;
    e->nnodes = nurls;
    e->quorum = opts->quorum ? opts->quorum : nurls / 2 + 1;
    snprintf(e->timeout_text, sizeof(e->timeout_text), "no reply within %d ms", opts->node_timeout_ms);
    rl_replicas_init(&e->replicas, e->urls, nurls, &e->opts);
    for (int i = 0; i < nurls; i++) {
        rl_stream_init(&e->nodes[i], &e->urls[i], i, &e->opts, e->clusters[i] ? rl_cluster_seed_reply : rl_op_reply, e,
                       e->nodes, nurls);
        e->nodes[i].reader.keep_top = e->clusters[i] != NULL; /* its CLUSTER NODES text */
        if (e->clusters[i]) e->nodes[i].reader.max_string = RL_CLUSTER_TEXT_MAX;
    }
    rl_keep_init(&e->keep);
    if (rl_subs_init(&e->subs, e->urls, nurls, &e->opts) != 0) {
        rl_engine_free(e);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    rl_cluster_subs(e);
    return e;
}

void rl_engine_free(rl_engine *e) {
    if (e == NULL) return;
    for (int i = 0; i < e->nnodes; i++) rl_stream_free(&e->nodes[i]);
    rl_cluster_free(e);
    rl_subs_free(&e->subs);
    for (int i = 0; i < e->nops; i++) {
        rl_buf_free(&e->ops[i]->key);
        rl_buf_free(&e->ops[i]->cmd);
        rl_buf_free(&e->ops[i]->ccmd);
        rl_buf_free(&e->ops[i]->ckey);
        rl_buf_free(&e->ops[i]->cbase);
        free(e->ops[i]);
    }
    free(e->ops);
    rl_deadlines_free(&e->deadlines);
    rl_keep_free(&e->keep);
    rl_buf_free(&e->scratch);
    rl_buf_free(&e->redirect);
    rl_buf_free(&e->base);
    rl_buf_free(&e->scratch2);
    free(e->prefix);
    free(e);
}

int rl_engine_nodes(const rl_engine *e) {
    return e->nnodes;
}

/* Where link k connects: its node's URL (k, or k - N for a subscriber
 * link), or its shard's (links 2N and on), or NULL. */
static const rl_url *url_at(const rl_engine *e, int k) {
    if (k >= 0 && k < e->nnodes) return &e->urls[k];
    if (k >= e->nnodes && k < 2 * e->nnodes) return &e->urls[k - e->nnodes];
    const rl_shard *sh = k >= 2 * e->nnodes ? rl_cluster_shard(e, (k - 2 * e->nnodes) / 2) : NULL;
    return sh ? &sh->url : NULL;
}

const char *rl_engine_node_name(const rl_engine *e, int i) {
    const rl_url *u = url_at(e, i);
    return u ? u->name : NULL;
}

const char *rl_engine_node_host(const rl_engine *e, int i) {
    const rl_url *u = url_at(e, i);
    return u == NULL ? NULL : u->kind == RL_URL_UNIX ? u->path : u->host;
}

int rl_engine_node_tls(const rl_engine *e, int i) {
    const rl_url *u = url_at(e, i);
    return u && u->kind == RL_URL_TCP && u->tls;
}

const char *rl_engine_node_tls_name(const rl_engine *e, int i) {
    const rl_url *u = url_at(e, i);
    if (u == NULL || u->kind != RL_URL_TCP) return NULL;
    return u->tls_name[0] ? u->tls_name : u->host;
}

int rl_engine_node_port(const rl_engine *e, int i) {
    const rl_url *u = url_at(e, i);
    return u && u->kind == RL_URL_TCP ? u->port : 0;
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

double rl_engine_deadline(const rl_engine *e) {
    double at = -1, d;
    if (rl_deadlines_first(&e->deadlines, &d) >= 0) at = d;
    for (int i = 0; i <= e->nnodes + e->nshards; i++) {
        d = i < e->nnodes ? rl_stream_deadline(&e->nodes[i])
            : i == e->nnodes ? rl_subs_deadline(&e->subs)
                             : rl_stream_deadline(&e->shards[i - e->nnodes - 1]->st);
        if (d > 0 && (at < 0 || d < at)) at = d;
    }
    d = rl_keep_deadline(&e->keep);
    if (d >= 0 && (at < 0 || d < at)) at = d;
    d = rl_cluster_retry_deadline(e);
    if (d >= 0 && (at < 0 || d < at)) at = d;
    return at;
}

void rl_engine_advance(rl_engine *e, double now_ms) {
    double now = clock_at(e, now_ms), at;
    /* releases kept past the longest ttl (its drift allowance included)
     * delete nothing: no key they name is left */
    double kept_ms = e->max_ttl_ms * (1.0 + e->opts.drift_factor);
    for (int i = 0; i < e->nnodes; i++) {
        rl_stream_expire_redo(&e->nodes[i], kept_ms, now);
        rl_stream_advance(&e->nodes[i], now);
    }
    for (int k = 0; k < e->nshards; k++) {
        rl_stream_expire_redo(&e->shards[k]->st, kept_ms, now);
        rl_stream_advance(&e->shards[k]->st, now);
    }
    rl_subs_advance(&e->subs, now);
    rl_cluster_retry_advance(e);
    int slot;
    while ((slot = rl_deadlines_first(&e->deadlines, &at)) >= 0 && at <= now) rl_op_timeout(e, e->ops[slot]);
    rl_keep_advance(e, &e->keep, now);
}
