/* links.c — the engine's side of the driver contract, link by link
 * (redlock.h, "Links"): what the driver reports of each connection and
 * what each asks of it. Links 0 .. N-1 are the nodes' command streams
 * (stream.c), links N .. 2N-1 their subscriber streams (substream.c);
 * from 2N on, two links per shard of the cluster nodes (cluster.h): its
 * command stream, then its subscriber stream. */
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"
#include "text.h"

/* The command stream of link k: a node's, or a shard's; else NULL. */
static rl_stream *node_of(rl_engine *e, int node) {
    if (node >= 0 && node < e->nnodes) return &e->nodes[node];
    rl_shard *sh = node >= 2 * e->nnodes && (node - 2 * e->nnodes) % 2 == 0
                       ? rl_cluster_shard(e, (node - 2 * e->nnodes) / 2) : NULL;
    return sh ? &sh->st : NULL;
}

/* The shard of link k (2N and on; NULL for a node's link) and, in *bit,
 * the link's bit in its stale (1: its command link, 2: its subscriber). */
static rl_shard *link_shard(const rl_engine *e, int k, unsigned *bit) {
    if (k < 2 * e->nnodes) return NULL;
    *bit = 1u << ((k - 2 * e->nnodes) % 2);
    return rl_cluster_shard(e, (k - 2 * e->nnodes) / 2);
}

/* 1 if link k is a shard's that was reused for another master while the
 * driver still had a socket on it (cluster.c): until the driver takes the
 * link's wishes (its RL_WANT_CLOSE), what it reports of the link is of
 * that socket, to the master before, and is refused. */
static int stale(const rl_engine *e, int k) {
    unsigned bit = 0;
    const rl_shard *sh = link_shard(e, k, &bit);
    return sh && (sh->stale & bit);
}

int rl_engine_links(const rl_engine *e) {
    return 2 * e->nnodes + 2 * e->nshards;
}

/* The subscriber stream of link k (a node's: N .. 2N-1, its index k - N;
 * a shard's: 2N + 2j + 1, its index N + j), or -1 if k is no subscriber link. */
static int sub_of(const rl_engine *e, int k) {
    if (k >= e->nnodes && k < 2 * e->nnodes) return k - e->nnodes;
    if (k < 2 * e->nnodes || (k - 2 * e->nnodes) % 2 == 0) return -1;
    int j = e->nnodes + (k - 2 * e->nnodes) / 2;
    return j < e->subs.nsubs ? j : -1;
}

/* 1 if link k wants anything of the driver. */
static int link_wanting(const rl_engine *e, int k) {
    if (k < e->nnodes) return rl_stream_wanting(&e->nodes[k]);
    int j = sub_of(e, k);
    if (j >= 0) return rl_subs_wanting(&e->subs, j);
    const rl_shard *sh = (k - 2 * e->nnodes) % 2 == 0 ? rl_cluster_shard(e, (k - 2 * e->nnodes) / 2) : NULL;
    return sh && rl_stream_wanting(&sh->st);
}

int rl_engine_next_wanting(const rl_engine *e, int after) {
    /* by kind of link, in link order: the nodes' streams, their
     * subscribers, then each shard's stream and subscriber */
    int n = e->nnodes, k = after < 0 ? 0 : after + 1;
    for (; k < n; k++)
        if (rl_stream_wanting(&e->nodes[k])) return k;
    for (; k < 2 * n; k++)
        if (rl_subs_wanting(&e->subs, k - n)) return k;
    for (int end = 2 * n + 2 * e->nshards; k < end; k++) {
        int j = (k - 2 * n) / 2;
        if ((k - 2 * n) % 2 == 0 ? rl_stream_wanting(&e->shards[j]->st)
                                 : n + j < e->subs.nsubs && rl_subs_wanting(&e->subs, n + j))
            return k;
    }
    return -1;
}


unsigned rl_engine_wanting(const rl_engine *e) {
    unsigned bits = 0;
    for (int k = 0; k < rl_engine_links(e) && k < 32; k++)
        if (link_wanting(e, k)) bits |= 1u << k;
    return bits;
}

int rl_engine_node_wants(rl_engine *e, int node) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    unsigned bit = 0;
    rl_shard *sh = link_shard(e, node, &bit);
    if (sh) sh->stale &= ~bit; /* the driver closes the socket before, if asked: the link's reports count again */
    return s ? rl_stream_take_wants(s, e->now) : j >= 0 ? rl_subs_take_wants(&e->subs, j, e->now) : 0;
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
    if (stale(e, node)) return RL_ERR;
    if (j >= 0) return rl_subs_connected(&e->subs, j, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
    if (s == NULL || rl_stream_connected(s, fresh, clock_at(e, now_ms)) != 0) return RL_ERR;
    return RL_OK;
}

void rl_engine_node_handshaking(rl_engine *e, int node) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (stale(e, node)) return;
    if (s) rl_stream_handshaking(s);
    else if (j >= 0) rl_subs_handshaking(&e->subs, j);
}

void rl_engine_node_down(rl_engine *e, int node, const char *why, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    char address[sizeof(s->url->host) + 8], master[sizeof(address) + 16], said[RL_NODE_ERR_LEN];
    if (stale(e, node)) return;
    if (s && node >= e->nnodes && why && *why) { /* a shard's: which master of the cluster it was */
        rl_url_address(s->url, address, sizeof(address));
        snprintf(master, sizeof(master), " (master %s)", address);
        rl_text_join(said, sizeof(said), why, master);
        why = said;
    }
    if (s) rl_stream_down(s, why, clock_at(e, now_ms));
    else if (j >= 0) rl_subs_down(&e->subs, j, why, clock_at(e, now_ms));
    /* A master's connection lost, with or without commands in flight: the
     * cluster may have moved it (a failover, the node restarted at another
     * address), so its map is asked for again now, while a node that knows
     * the new one may still be reachable (one refresh a while at most). */
    unsigned bit = 0;
    rl_shard *sh = s ? link_shard(e, node, &bit) : NULL;
    if (sh && bit == 1) rl_cluster_shard_unreachable(e, sh->node);
}

void rl_engine_node_closed_unused(rl_engine *e, int node, const char *why, double now_ms) {
    rl_stream *s = node_of(e, node);
    if (stale(e, node)) return;
    if (s != NULL && rl_stream_unused(s)) rl_stream_closed_unused(s, why, clock_at(e, now_ms));
    else rl_engine_node_down(e, node, why, now_ms);
}

int rl_engine_node_detach(rl_engine *e, int node, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (stale(e, node)) return 0;
    if (j >= 0) return rl_subs_detach(&e->subs, j, clock_at(e, now_ms));
    return s ? rl_stream_detach(s, clock_at(e, now_ms)) : 0;
}

size_t rl_engine_node_output(rl_engine *e, int node, const char **data) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (stale(e, node)) return 0;
    if (data == NULL) return 0;
    return s ? rl_stream_output(s, data) : j >= 0 ? rl_subs_output(&e->subs, j, data) : 0;
}

void rl_engine_node_wrote(rl_engine *e, int node, size_t n, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (stale(e, node)) return;
    if (s) rl_stream_wrote(s, n, clock_at(e, now_ms));
    else if (j >= 0) rl_subs_wrote(&e->subs, j, n);
}

int rl_engine_node_feed(rl_engine *e, int node, const char *data, size_t len, double now_ms) {
    rl_stream *s = node_of(e, node);
    int j = sub_of(e, node);
    if (stale(e, node)) return RL_ERR;
    if ((s == NULL && j < 0) || (data == NULL && len > 0)) return RL_ERR;
    if (j >= 0) return rl_subs_feed(&e->subs, j, data, len, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
    return rl_stream_feed(s, data, len, clock_at(e, now_ms)) == 0 ? RL_OK : RL_ERR;
}

void rl_engine_node_unsent(rl_engine *e, int node, long long bytes) {
    rl_stream *s = node_of(e, node);
    if (stale(e, node)) return;
    if (s) rl_stream_unsent(s, bytes);
}

unsigned rl_engine_suspects_due(rl_engine *e, double now_ms) {
    double now = clock_at(e, now_ms), every = e->opts.node_timeout_ms;
    unsigned bits = 0;
    for (int i = 0; i < e->nnodes; i++) {
        rl_stream *s = &e->nodes[i];
        if (!rl_stream_suspect(s) || now < s->peeked_ms + every) continue;
        s->peeked_ms = now;
        bits |= 1u << i;
    }
    return bits;
}

int rl_engine_node_unanswered(const rl_engine *e, int node) {
    const rl_stream *s = node_of((rl_engine *)e, node);
    return s ? (int)s->ring_count : 0;
}

const char *rl_engine_node_errstr(const rl_engine *e, int node) {
    int j = sub_of(e, node);
    const rl_stream *s = node_of((rl_engine *)e, node);
    return s ? s->errstr : j >= 0 ? e->subs.nodes[j].errstr : NULL;
}
