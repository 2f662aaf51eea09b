/* cluster_retry.c — commands a cluster node's shard refused with TRYAGAIN,
 * kept to go to the same shard again after a pause (see cluster.h).
 *
 * Redis says TRYAGAIN to a command naming several keys of a slot that is
 * being migrated when not all of those keys are on one side yet: a
 * semaphore's scripts (every slot's key), a release that also names its
 * queue. The migration of a slot usually takes milliseconds, so a few sends
 * within the node timeout turn what was a failed vote into an answer. Part
 * of the engine: no I/O, no clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* One kept command: where it goes again, when, and what it met. */
typedef struct rl_retry {
    rl_shard *sh;
    rl_ticket t;      /* the ticket it goes again with */
    double due;
    rl_buf cmd;
    rl_reply refusal; /* the TRYAGAIN, the answer if it may not go again */
} rl_retry;

static int is_tryagain(const rl_reply *r) {
    return r && r->type == RL_REPLY_ERROR && strncmp(r->str, "TRYAGAIN", 8) == 0 &&
           (r->str[8] == ' ' || r->str[8] == '\0');
}

/* The pause before a send again: an eighth of the node timeout, bounded. */
static double pause_ms(const rl_engine *e) {
    double ms = e->opts.node_timeout_ms / 8.0;
    return ms < RL_TRYAGAIN_MIN_MS ? RL_TRYAGAIN_MIN_MS : ms > RL_TRYAGAIN_MAX_MS ? RL_TRYAGAIN_MAX_MS : ms;
}

/* See cluster.h. */
int rl_cluster_retry_later(rl_engine *e, rl_shard *sh, rl_ticket t, const rl_reply *reply) {
    if (!is_tryagain(reply)) return 0;
    if (!e->opts.no_stats) e->stats.node[sh->node].tryagain++;
    if (e->redirect.len == 0 || t.tryagains >= RL_TRYAGAIN_MAX || !rl_op_may_resend(e, t)) return 0;
    if (e->nretries == e->capretries) {
        int cap = e->capretries ? e->capretries * 2 : 8;
        rl_retry *more = realloc(e->retries, (size_t)cap * sizeof(*more));
        if (more == NULL) return 0;
        e->retries = more;
        e->capretries = cap;
    }
    rl_retry *r = &e->retries[e->nretries];
    memset(r, 0, sizeof(*r));
    if (rl_buf_reserve(&r->cmd, e->redirect.len) != 0) {
        rl_buf_free(&r->cmd);
        return 0;
    }
    memcpy(r->cmd.data, e->redirect.data, e->redirect.len);
    r->cmd.len = e->redirect.len;
    r->sh = sh;
    r->t = t;
    r->t.tryagains++;
    r->due = e->now + pause_ms(e);
    r->refusal = *reply;
    e->nretries++;
    rl_op_resend_later(e, sh->node, r->t);
    return 1;
}

/* See cluster.h. */
double rl_cluster_retry_deadline(const rl_engine *e) {
    double at = -1;
    for (int k = 0; k < e->nretries; k++)
        if (at < 0 || e->retries[k].due < at) at = e->retries[k].due;
    return at;
}

/* Send r's command again through its shard (after ASKING if it went so). */
static void send_again(rl_engine *e, rl_retry *r) {
    rl_ticket t = r->t;
    int node = r->sh->node;
    t.sent_ms = e->now;
    if ((!t.asked || rl_shard_send_asking(r->sh, t.resend) == 0) && rl_shard_send(r->sh, r->cmd.data, r->cmd.len, t) == 0) {
        rl_op_redirected(e, r->sh, node, t);
        return;
    }
    t.unsent = 1;
    rl_op_resend_refused(e, &r->sh->st, node, t, NULL, r->sh->st.errstr);
}

/* See cluster.h. */
void rl_cluster_retry_advance(rl_engine *e) {
    for (int k = 0; k < e->nretries;) {
        if (e->retries[k].due > e->now) {
            k++;
            continue;
        }
        /* taken off the list first: what it calls may keep another */
        rl_retry r = e->retries[k];
        e->retries[k] = e->retries[--e->nretries];
        if (rl_op_may_resend(e, r.t)) send_again(e, &r);
        else rl_op_resend_refused(e, &r.sh->st, r.sh->node, r.t, &r.refusal, NULL);
        rl_buf_free(&r.cmd);
    }
}

/* See cluster.h. */
int rl_cluster_retry_holds(const rl_engine *e, const rl_shard *sh) {
    for (int k = 0; k < e->nretries; k++)
        if (e->retries[k].sh == sh) return 1;
    return 0;
}

/* See cluster.h. */
void rl_cluster_retry_free(rl_engine *e) {
    for (int k = 0; k < e->nretries; k++) rl_buf_free(&e->retries[k].cmd);
    free(e->retries);
    e->retries = NULL;
    e->nretries = e->capretries = 0;
}

/* See cluster.h. */
int rl_cluster_retry_text(const rl_engine *e, int slot, unsigned gen, int i, char *out, size_t cap) {
    for (int k = 0; k < e->nretries; k++) {
        const rl_retry *r = &e->retries[k];
        if (r->sh->node == i && r->t.slot == slot && r->t.gen == gen) {
            snprintf(out, cap, "%s (the slot still migrating after %d send%s)", r->refusal.str, r->t.tryagains,
                     r->t.tryagains == 1 ? "" : "s");
            return 1;
        }
    }
    return 0;
}
