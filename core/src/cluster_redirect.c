/* cluster_redirect.c — what a cluster node's shard does with a reply
 * (see cluster.h): the commands it awaits replies to, kept so that MOVED
 * or ASK can send one again, and following those redirections (TRYAGAIN
 * goes to cluster_retry.c). Part of the engine: no I/O, no clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* ---- the commands a shard awaits replies to ---- */

/* Note cmd as sent to sh (its reply is the next one after those noted).
 * Return 0, or -1 when out of memory. */
static int sent_push(rl_shard *sh, const char *cmd, size_t len) {
    if (sh->count == sh->cap) {
        unsigned cap = sh->cap ? sh->cap * 2 : 16;
        size_t *lens = malloc(cap * sizeof(*lens));
        if (lens == NULL) return -1;
        for (unsigned j = 0; j < sh->count; j++) lens[j] = sh->lens[(sh->head + j) % sh->cap];
        free(sh->lens);
        sh->lens = lens;
        sh->cap = cap;
        sh->head = 0;
    }
    if (sh->sent_off > 0 && sh->sent_off == sh->sent.len) sh->sent.len = sh->sent_off = 0;
    if (sh->sent_off > 4096 && sh->sent_off * 2 > sh->sent.len) {
        memmove(sh->sent.data, sh->sent.data + sh->sent_off, sh->sent.len - sh->sent_off);
        sh->sent.len -= sh->sent_off;
        sh->sent_off = 0;
    }
    if (rl_buf_reserve(&sh->sent, len) != 0) return -1;
    memcpy(sh->sent.data + sh->sent.len, cmd, len);
    sh->sent.len += len;
    sh->lens[(sh->head + sh->count++) % sh->cap] = len;
    return 0;
}

/* Take the oldest command noted into e->redirect (it stays valid while
 * other shards are sent to). */
static void sent_pop(rl_shard *sh, rl_buf *into) {
    into->len = 0;
    if (sh->count == 0) return;
    size_t len = sh->lens[sh->head];
    sh->head = (sh->head + 1) % sh->cap;
    sh->count--;
    if (rl_buf_reserve(into, len) == 0) {
        memcpy(into->data, sh->sent.data + sh->sent_off, len);
        into->len = len;
    }
    sh->sent_off += len;
}

/* See cluster.h. */
int rl_shard_send(rl_shard *sh, const char *cmd, size_t len, rl_ticket t) {
    if (rl_stream_send(&sh->st, cmd, len, t, sh->e->now) != 0) return -1;
    if (sent_push(sh, cmd, len) == 0) return 0;
    /* the bytes could not be noted: this connection's replies would no
     * longer pair with them; start over */
    rl_stream_reset(&sh->st, "connection reset: out of memory", sh->e->now);
    return 0;
}

/* See cluster.h. */
int rl_shard_send_asking(rl_shard *sh, int resend) {
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    rl_ticket a = {-1, 0, RL_KIND_ASKING, sh->e->now, 0, 0, 0, 0, 0, 0, 0};
    a.resend = resend;
    return rl_shard_send(sh, asking, sizeof(asking) - 1, a);
}

/* ---- MOVED and ASK ---- */

/* "MOVED 3999 127.0.0.1:6381" or "ASK ...": the slot, host and port, or -1. */
static int redirection(const rl_reply *reply, const char *word, char *host, size_t hostcap, int *port) {
    size_t wl = strlen(word);
    if (reply->type != RL_REPLY_ERROR || strncmp(reply->str, word, wl) != 0 || reply->str[wl] != ' ') return -1;
    const char *p = reply->str + wl + 1, *sp = strchr(p, ' ');
    const char *colon = sp ? strrchr(sp, ':') : NULL;
    if (sp == NULL || colon == NULL || (size_t)(colon - sp - 1) >= hostcap) return -1;
    int slot = atoi(p);
    memcpy(host, sp + 1, (size_t)(colon - sp - 1));
    host[colon - sp - 1] = '\0';
    *port = atoi(colon + 1);
    return slot >= 0 && slot < RL_HASH_SLOTS && *port > 0 && *port <= 65535 ? slot : -1;
}

/* 1 if the operation t belongs to still waits for this command's reply. */
static int ticket_live(const rl_engine *e, rl_ticket t) {
    return t.slot >= 0 && t.slot < e->nops && e->ops[t.slot]->gen == t.gen && e->ops[t.slot]->phase != OP_QUIET &&
           e->ops[t.slot]->phase != OP_FREE;
}

/* A reply (or a failure) on shard sh to the command whose bytes are in
 * e->redirect: follow MOVED or ASK if it says so and may. 1 if followed. */
static int follow(rl_engine *e, rl_shard *sh, rl_ticket t, const rl_reply *reply) {
    char host[256];
    int port, slot, ask = 0, i = sh->node;
    rl_cluster *c = e->clusters[i];
    if (reply == NULL) return 0;
    if ((slot = redirection(reply, "MOVED", host, sizeof(host), &port)) < 0) {
        if ((slot = redirection(reply, "ASK", host, sizeof(host), &port)) < 0) return 0;
        ask = 1;
    }
    if (!e->opts.no_stats) {
        if (ask) e->stats.node[i].ask++;
        else e->stats.node[i].moved++;
    }
    /* Redis 7's cluster-preferred-endpoint-type: "unknown-endpoint" names
     * no host (":6381"), which means the node that replied; "hostname" with
     * no hostname announced names "?", an address nobody can reach (the
     * fresh map will say where the slot is) */
    if (host[0] == '\0') snprintf(host, sizeof(host), "%s", sh->url.host);
    rl_shard *to = strcmp(host, "?") == 0 ? NULL : rl_cluster_shard_at(e, i, host, port);
    if (!ask && to && c->owner[slot] != to->number + 1) {
        c->owner[slot] = (unsigned char)(to->number + 1);
        rl_subs_rerouted(&e->subs, e->now);
    }
    if (!ask) rl_cluster_ask_map(e, i);
    if (e->redirect.len == 0 || !ticket_live(e, t) || t.redirects >= RL_CLUSTER_REDIRECTS || (ask && t.asked))
        return 0;
    if (to == NULL && strcmp(host, "?") != 0) { /* no shard can be made for it: say why, as the vote's reason */
        char why[RL_NODE_ERR_LEN];
        rl_cluster_no_shard(e, reply->str, why, sizeof(why));
        t.unsent = 1;
        rl_op_reply_from(e, &sh->st, i, t, NULL, why);
        return 1;
    }
    if (to == NULL) return 0;
    t.redirects++;
    t.sent_ms = e->now;
    if (ask) {
        if (rl_shard_send_asking(to, t.resend) != 0) return 0;
        t.asked = 1;
    } else {
        t.asked = 0;
    }
    if (rl_shard_send(to, e->redirect.data, e->redirect.len, t) == 0) {
        rl_op_redirected(e, to, i, t);
        return 1;
    }
    t.unsent = 1;
    rl_op_reply_from(e, &to->st, i, t, NULL, to->st.errstr);
    return 1;
}

/* A reply on sh (or its failure): the map's, a redirection, a TRYAGAIN,
 * or the operation's. */
static void shard_reply(rl_engine *e, rl_shard *sh, int node, rl_ticket t, const rl_reply *reply,
                        const char *errstr) {
    if (t.kind == RL_KIND_TOPOLOGY) {
        rl_cluster_map_reply(e, node, &sh->st, reply, errstr);
        return;
    }
    if (t.kind == RL_KIND_ASKING || follow(e, sh, t, reply) || rl_cluster_retry_later(e, sh, t, reply)) return;
    if (reply == NULL) rl_cluster_shard_unreachable(e, node); /* before the reply: it may send again */
    rl_op_reply_from(e, &sh->st, node, t, reply, errstr);
}

void rl_shard_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    rl_shard *sh = owner;
    rl_engine *e = sh->e;
    sent_pop(sh, &e->redirect);
    sh->replying++; /* its stream is on the stack: no new master may take the shard meanwhile */
    shard_reply(e, sh, node, t, reply, errstr);
    sh->replying--;
}
