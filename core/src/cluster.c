/* cluster.c — a node that is a Redis Cluster (see cluster.h): its seeds,
 * its map of hash slots to shards, the shards' streams, and what MOVED
 * and ASK make of a reply. Part of the engine: no I/O, no clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

static const char SCHEME[] = "redis-cluster://", SCHEME_TLS[] = "rediss-cluster://";

int rl_cluster_url(const char *text) {
    return text && (strncmp(text, SCHEME, sizeof(SCHEME) - 1) == 0 || strncmp(text, SCHEME_TLS, sizeof(SCHEME_TLS) - 1) == 0);
}

rl_shard *rl_cluster_shard(const rl_engine *e, int k) {
    return k >= 0 && k < e->nshards ? e->shards[k] : NULL;
}


/* The shard of node i at host:port (its address or its alias), or NULL. */
static rl_shard *shard_find(rl_engine *e, int i, const char *host, int port) {
    for (int k = 0; k < e->nshards; k++) {
        rl_shard *sh = e->shards[k];
        if (sh->node == i && sh->url.port == port && (strcmp(sh->url.host, host) == 0 || strcmp(sh->alias, host) == 0))
            return sh;
    }
    return NULL;
}

/* Point sh at node i's master at host:port: the seed's URL moved there,
 * its certificate for host (shard_of may say otherwise). */
static void shard_place(rl_engine *e, rl_shard *sh, int i, const char *host, int port) {
    sh->node = i;
    sh->url = e->urls[i];
    snprintf(sh->url.host, sizeof(sh->url.host), "%s", host);
    sh->url.tls_name[0] = '\0';
    sh->url.port = port;
    snprintf(sh->url.name, sizeof(sh->url.name), "%s://%s:%d (shard of node %d)", sh->url.tls ? "rediss" : "redis",
             host, port, i + 1);
    sh->alias[0] = '\0';
}

/* The shards a map names: node i's as mine says (the map in use, or the
 * one being read), every other cluster node's as it stands. */
static unsigned long long mapped(const rl_engine *e, int i, const unsigned char *mine) {
    unsigned long long bits = 0;
    for (int j = 0; j < e->nnodes; j++) {
        const unsigned char *owner = j == i ? mine : e->clusters[j] ? e->clusters[j]->owner : NULL;
        for (int s = 0; owner && s < RL_HASH_SLOTS; s++)
            if (owner[s]) bits |= 1ull << (owner[s] - 1);
    }
    return bits;
}

/* May sh serve another master? Only if nothing depends on it: no map
 * names it (held: the shards named, or taken by the map being read; so no
 * watch is served by its subscriber stream), it is no seed, its replies
 * are not being handled, and it owes nothing: no reply, nothing
 * unwritten, no TRYAGAIN to go again, and, while it is connected, no
 * release kept for its next connection (rl_stream_redo). A master no map
 * names whose address no longer answers would keep those releases, and
 * the shard, for good; reused, they are dropped, and their keys stay until
 * their ttl on that master, wherever it went. */
static int shard_free_for(const rl_engine *e, const rl_shard *sh, unsigned long long held) {
    int owes_writes = rl_stream_unwritten(&sh->st) && sh->st.state == RL_STREAM_UP;
    return !(held & (1ull << sh->number)) && !sh->seed && sh->replying == 0 && sh->count == 0 &&
           sh->st.ring_count == 0 && !owes_writes && !rl_cluster_retry_holds(e, sh);
}

/* A shard free for another master (shard_free_for), started over as node
 * i's at host:port: its connections closed through the engine (the driver
 * is asked to close them, and what it says of them until it has taken
 * that is ignored: links.c); or NULL if none is free. */
static rl_shard *shard_reuse(rl_engine *e, int i, const char *host, int port, unsigned long long held) {
    rl_shard *sh = NULL;
    for (int k = 0; k < e->nshards && sh == NULL; k++)
        if (shard_free_for(e, e->shards[k], held)) sh = e->shards[k];
    if (sh == NULL) return NULL;
    unsigned long long bit = 2ull << sh->number; /* a new master: not asked for the map in this spell */
    e->clusters[sh->node]->tried &= ~bit;
    e->clusters[i]->tried &= ~bit;
    shard_place(e, sh, i, host, port);
    sh->sent.len = sh->sent_off = 0;
    sh->head = 0;
    if (rl_stream_restart(&sh->st, i)) sh->stale |= 1;
    int j = e->nnodes + sh->number;
    if (j < e->subs.nsubs && rl_subs_restart(&e->subs, j)) sh->stale |= 2;
    return sh;
}

/* The shard of node i at host:port, made (or reused, once RL_MAX_SHARDS
 * are made) if there is none: see rl_cluster_shard_at. mine: node i's map
 * as it stands for this (c->owner, or the map being read); taken: the
 * shards the map being read has taken so far. */
static rl_shard *shard_at(rl_engine *e, int i, const char *host, int port, const unsigned char *mine,
                          unsigned long long taken) {
    rl_shard *found = host[0] ? shard_find(e, i, host, port) : NULL;
    if (found) return found;
    if (e->nshards == RL_MAX_SHARDS) return shard_reuse(e, i, host, port, mapped(e, i, mine) | taken);
    rl_shard *sh = calloc(1, sizeof(*sh));
    if (sh == NULL) return NULL;
    sh->e = e;
    sh->number = e->nshards;
    shard_place(e, sh, i, host, port);
    /* no peers: a shard's server is the cluster's, not a voter of its own */
    rl_stream_init(&sh->st, &sh->url, i, &e->opts, rl_shard_reply, sh, NULL, 0);
    sh->st.reader.keep_top = 1;
    sh->st.reader.max_string = RL_CLUSTER_TEXT_MAX;
    e->shards[e->nshards++] = sh;
    if (e->subs.nsubs > 0) rl_subs_add(&e->subs, &sh->url); /* stream nnodes + number */
    return sh;
}

/* See cluster.h. */
rl_shard *rl_cluster_shard_at(rl_engine *e, int i, const char *host, int port) {
    return shard_at(e, i, host, port, e->clusters[i]->owner, 0);
}

/* See cluster.h. */
void rl_cluster_no_shard(const rl_engine *e, const char *what, char *buf, size_t len) {
    if (e->nshards == RL_MAX_SHARDS) snprintf(buf, len, "too many cluster masters (%d): %s", RL_MAX_SHARDS, what);
    else snprintf(buf, len, "out of memory: %s", what);
}

/* See rl_cluster_subs. */
static int serves(void *owner, int j, const rl_watched *w) {
    rl_engine *e = owner;
    if (j < e->nnodes) return e->clusters[j] == NULL;
    const rl_shard *sh = rl_cluster_shard(e, j - e->nnodes);
    return sh && w->hslot >= 0 && e->clusters[sh->node]->owner[w->hslot] == sh->number + 1;
}

/* See rl_subs.lost_shard. */
static void lost_shard(void *owner, int j, int refused) {
    rl_engine *e = owner;
    const rl_shard *sh = rl_cluster_shard(e, j - e->nnodes);
    if (sh && refused) rl_cluster_shard_unreachable(e, sh->node); /* (at most once a while) */
    else if (sh) rl_cluster_ask_map(e, sh->node);
}

void rl_cluster_subs(rl_engine *e) {
    if (e->nclusters == 0) return;
    e->subs.clusters = 1;
    e->subs.serves = serves;
    e->subs.lost_shard = lost_shard;
    e->subs.owner = e;
    for (int k = 0; k < e->nshards; k++) rl_subs_add(&e->subs, &e->shards[k]->url);
}

/* The parts of a cluster URL: after the scheme, the user:password@ (if
 * any), the seeds joined by '+', and the query (?replicas=N) every seed
 * takes. */
typedef struct cluster_text {
    int tls;
    const char *rest;   /* after the scheme */
    int userlen;        /* "user:password@" at rest, 0 when none */
    const char *hosts;  /* the seeds */
    size_t hostslen;
    const char *query;  /* "" when none */
} cluster_text;

static void split(const char *text, cluster_text *t) {
    t->tls = strncmp(text, SCHEME_TLS, sizeof(SCHEME_TLS) - 1) == 0;
    t->rest = text + (t->tls ? sizeof(SCHEME_TLS) : sizeof(SCHEME)) - 1;
    const char *at = strrchr(t->rest, '@');
    t->hosts = at ? at + 1 : t->rest;
    t->userlen = at ? (int)(at - t->rest) + 1 : 0;
    t->query = strchr(t->hosts, '?');
    t->hostslen = t->query ? (size_t)(t->query - t->hosts) : strlen(t->hosts);
    if (t->query == NULL) t->query = "";
}

/* See cluster.h. */
int rl_cluster_name(const char *text, char *buf, size_t len) {
    cluster_text t;
    split(text, &t);
    int n = snprintf(buf, len, "%s%s", t.tls ? SCHEME_TLS : SCHEME, t.hosts);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* See cluster.h. */
int rl_cluster_seed(const char *text, int k, rl_url *u, char *err, size_t errlen) {
    cluster_text t;
    char name[RL_NODE_ERR_LEN];
    split(text, &t);
    if (rl_cluster_name(text, name, sizeof(name)) != 0) return snprintf(err, errlen, "cluster URL too long"), -1;
    int seeds = 0;
    for (const char *p = t.hosts, *stop = t.hosts + t.hostslen; p < stop; seeds++) {
        const char *end = memchr(p, '+', (size_t)(stop - p));
        size_t len = end ? (size_t)(end - p) : (size_t)(stop - p);
        if (seeds == k) {
            char seed[600], why[RL_ERR_LEN];
            if (len == 0) return snprintf(err, errlen, "'%s': an empty seed", name), -1;
            int n = snprintf(seed, sizeof(seed), "%s://%.*s%.*s%s", t.tls ? "rediss" : "redis", t.userlen, t.rest,
                             (int)len, p, t.query);
            if (n < 0 || (size_t)n >= sizeof(seed)) return snprintf(err, errlen, "'%s': a seed URL is too long", name), -1;
            if (rl_url_parse(seed, u, why, sizeof(why)) != 0) return snprintf(err, errlen, "cluster seed %d: %s", k + 1, why), -1;
            if (u->db != 0) return snprintf(err, errlen, "'%s': a cluster has only database 0", name), -1;
            if (end != NULL && end + 1 == stop) return snprintf(err, errlen, "'%s': an empty seed", name), -1;
            return 1;
        }
        p += len + (end != NULL);
    }
    if (seeds == 0) return snprintf(err, errlen, "'%s': no seed (redis-cluster://host:port+host:port)", name), -1;
    return 0;
}

int rl_cluster_add(rl_engine *e, int i, const char *text, char *err, size_t errlen) {
    rl_cluster *c = calloc(1, sizeof(*c));
    if (c == NULL) return snprintf(err, errlen, "out of memory"), -1;
    e->clusters[i] = c;
    if (rl_cluster_name(text, c->name, sizeof(c->name)) != 0) return snprintf(err, errlen, "cluster URL too long"), -1;
    rl_url u;
    int k = 0, rc;
    while ((rc = rl_cluster_seed(text, k, &u, err, errlen)) == 1) {
        if (k++ == 0) {
            e->urls[i] = u;
            snprintf(e->urls[i].name, sizeof(e->urls[i].name), "%s", c->name);
        } else {
            rl_shard *sh = rl_cluster_shard_at(e, i, u.host, u.port); /* every shard so far is a seed */
            if (sh == NULL)
                return snprintf(err, errlen, "'%s': too many shards (at most %d)", c->name, RL_MAX_SHARDS), -1;
            sh->seed = 1;
        }
    }
    return rc;
}

static void shard_free(rl_shard *sh) {
    rl_stream_free(&sh->st);
    rl_buf_free(&sh->sent);
    free(sh->lens);
    free(sh);
}

void rl_cluster_free(rl_engine *e) {
    rl_cluster_retry_free(e);
    for (int k = 0; k < e->nshards; k++) shard_free(e->shards[k]);
    e->nshards = 0;
    for (int i = 0; i < RL_MAX_NODES; i++) {
        rl_cluster *c = e->clusters[i];
        if (c == NULL) continue;
        rl_buf_free(&c->pend);
        free(c->pends);
        free(c);
        e->clusters[i] = NULL;
    }
}

/* ---- the map ---- */

/* Send every command that waited for node i's map where it goes now, in
 * the order they came; one that cannot go is answered as failed. */
static void send_pending(rl_engine *e, int i, const char *why) {
    rl_cluster *c = e->clusters[i];
    unsigned n = c->npend;
    size_t off = 0;
    c->npend = 0;
    for (unsigned j = 0; j < n; j++) {
        rl_pending p = c->pends[j];
        const char *cmd = c->pend.data + off;
        off += p.len;
        if (why == NULL && rl_route_send(e, i, p.hslot, cmd, p.len, p.t) == 0) continue;
        p.t.unsent = 1;
        rl_op_reply_from(e, rl_route(e, i, p.hslot), i, p.t, NULL, why ? why : rl_route(e, i, p.hslot)->errstr);
    }
    if (c->npend == 0) c->pend.len = 0;
}

/* The shard of node i for a master of the map at host:port that
 * announces hostname (NULL or "" if none): one shard a master, whether
 * MOVED named it by hostname first or the map by address; made at its
 * address if none, and then its certificate must be for the hostname it
 * announces (a shard known before, a seed or one MOVED named, keeps the
 * name it was known by). */
static rl_shard *shard_of(rl_engine *e, int i, const char *host, const char *hostname, int port,
                          const unsigned char *mine, unsigned long long taken) {
    rl_shard *sh = hostname && hostname[0] ? shard_find(e, i, hostname, port) : NULL;
    int made = sh == NULL && shard_find(e, i, host, port) == NULL;
    if (sh == NULL) sh = shard_at(e, i, host, port, mine, taken);
    if (sh && sh->url.port == port && strcmp(sh->url.host, host) == 0)
        snprintf(sh->alias, sizeof(sh->alias), "%s", hostname ? hostname : "");
    if (sh && made) snprintf(sh->url.tls_name, sizeof(sh->url.tls_name), "%s", hostname ? hostname : "");
    return sh;
}

/* Read a CLUSTER NODES text into owner: every master's slots, each
 * master's shard found, or made (or reused) with node i's map taken to be
 * mine. from: where it came from (a master that does not know its own
 * address says ":0"). *full: a master got no shard. Return the number of
 * slots served. */
static int parse_map(rl_engine *e, int i, const char *text, size_t len, const rl_url *from, unsigned char *owner,
                     const unsigned char *mine, int *full) {
    unsigned long long taken = 0;
    memset(owner, 0, RL_HASH_SLOTS);
    int served = 0;
    *full = 0;
    for (size_t at = 0; at < len;) {
        const char *line = text + at, *nl = memchr(line, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - line) : len - at;
        at += ll + 1;
        char buf[16384], *save = NULL, *f[8];
        if (ll >= sizeof(buf)) continue; /* a master of that many ranges is not one we can route: its slots stay unserved */
        memcpy(buf, line, ll);
        buf[ll] = '\0';
        int nf = 0;
        char *tok = strtok_r(buf, " \r", &save);
        for (; tok && nf < 8; tok = nf < 8 ? strtok_r(NULL, " \r", &save) : NULL) f[nf++] = tok;
        if (nf < 8 || strstr(f[2], "master") == NULL || strstr(f[2], "noaddr") || strstr(f[2], "handshake")) continue;
        /* ip:port@cport[,hostname] */
        char *cport = strchr(f[1], '@'), *hostname = cport ? strchr(cport, ',') : NULL;
        if (cport) *cport = '\0';
        if (hostname) hostname++;
        char *colon = strrchr(f[1], ':');
        if (colon == NULL) continue;
        *colon = '\0';
        int port = atoi(colon + 1);
        const char *host = f[1][0] ? f[1] : from->host;
        if (f[1][0] == '[') { /* [ipv6] */
            host = f[1] + 1;
            char *close = strchr(f[1], ']');
            if (close) *close = '\0';
        }
        if (port <= 0 || port > 65535) continue;
        rl_shard *sh = NULL;
        for (char *r = strtok_r(NULL, " \r", &save); r; r = strtok_r(NULL, " \r", &save)) {
            if (r[0] == '[') continue; /* a slot migrating or importing: its owner says where it is */
            char *dash = strchr(r, '-');
            int lo = atoi(r), hi = dash ? atoi(dash + 1) : lo;
            if (lo < 0 || hi >= RL_HASH_SLOTS || lo > hi) continue;
            if (sh == NULL && (sh = shard_of(e, i, host, hostname, port, mine, taken)) == NULL) {
                *full = 1;
                break;
            }
            taken |= 1ull << sh->number;
            for (int s = lo; s <= hi; s++) owner[s] = (unsigned char)(sh->number + 1), served++;
        }
    }
    return served;
}

/* Read a CLUSTER NODES text into node i's map (see parse_map). Return the
 * number of slots served. */
static int read_map(rl_engine *e, int i, const char *text, size_t len, const rl_url *from) {
    rl_cluster *c = e->clusters[i];
    unsigned char owner[RL_HASH_SLOTS];
    int full;
    int served = parse_map(e, i, text, len, from, owner, c->owner, &full);
    if (full) {
        /* the masters the map no longer names (held by the map in use until
         * now) may serve those that got no shard: read it again so */
        unsigned char first[RL_HASH_SLOTS];
        memcpy(first, owner, sizeof(first));
        served = parse_map(e, i, text, len, from, owner, first, &full);
    }
    if (served == 0) return 0; /* a node that serves nothing (or a text we cannot read) leaves the map */
    memcpy(c->owner, owner, sizeof(owner));
    c->known = 1;
    c->full = full;
    rl_subs_rerouted(&e->subs, e->now);
    /* every master gets its connection now, as a plain node does at start */
    for (int k = 0; k < e->nshards; k++) {
        rl_shard *sh = e->shards[k];
        int serves = 0;
        for (int s = 0; s < RL_HASH_SLOTS && !serves; s++) serves = c->owner[s] == sh->number + 1;
        if (sh->node == i && serves && sh->st.state == RL_STREAM_IDLE) rl_stream_open(&sh->st, e->now);
    }
    return served;
}

/* See cluster.h. */
void rl_cluster_map_reply(rl_engine *e, int i, rl_stream *s, const rl_reply *reply, const char *errstr) {
    rl_cluster *c = e->clusters[i];
    c->asking = 0;
    size_t len = 0;
    const char *text = reply ? rl_reader_element(&s->reader, 0, &len) : NULL;
    int served = text && reply->type == RL_REPLY_STRING ? read_map(e, i, text, len, s->url) : 0;
    if (served > 0) {
        c->tried = 0;
        send_pending(e, i, NULL);
        if (c->refresh) c->refresh = 0, rl_cluster_ask_map(e, i);
        return;
    }
    if (!c->known) {
        /* another seed, if one is left to ask, before the commands waiting fail */
        rl_cluster_ask_map(e, i);
        if (c->asking) return;
        char why[RL_NODE_ERR_LEN];
        snprintf(why, sizeof(why), "cluster map not known: %.70s",
                 reply ? (reply->type == RL_REPLY_ERROR ? reply->str : "no slot served") : errstr);
        send_pending(e, i, why);
    }
}

/* See cluster.h. */
void rl_cluster_ask_map(rl_engine *e, int i) {
    rl_cluster *c = e->clusters[i];
    if (c->asking && !(c->asked && rl_stream_suspect(c->asked))) {
        c->refresh = 1;
        return;
    }
    c->asking = 0; /* (a reply that comes after all is read as any map) */
    static const char cmd[] = "*2\r\n$7\r\nCLUSTER\r\n$5\r\nNODES\r\n";
    rl_ticket t = {-1, 0, RL_KIND_TOPOLOGY, e->now, 0, 0, 0, 0, 0, 0, 0};
    /* each stream once per spell: the seed's (bit 0), then the shards' (bit k + 1) */
    int sent = !(c->tried & 1) && e->nodes[i].state != RL_STREAM_DOWN &&
               rl_stream_send(&e->nodes[i], cmd, sizeof(cmd) - 1, t, e->now) == 0;
    if (sent) c->tried |= 1, c->asked = &e->nodes[i];
    for (int k = 0; k < e->nshards && !sent; k++) {
        rl_shard *sh = e->shards[k];
        unsigned long long bit = 2ull << k;
        sent = sh->node == i && !(c->tried & bit) && sh->st.state != RL_STREAM_DOWN &&
               rl_shard_send(sh, cmd, sizeof(cmd) - 1, t) == 0;
        if (sent) c->tried |= bit, c->asked = &sh->st;
    }
    if (sent) {
        c->asking = 1;
        return;
    }
    c->tried = 0; /* every stream was asked: the next spell starts over */
}

/* See cluster.h. */
void rl_cluster_shard_unreachable(rl_engine *e, int i) {
    rl_cluster *c = e->clusters[i];
    if (!c->known || e->now < c->remap_at) return;
    c->remap_at = e->now + RL_CLUSTER_REMAP_MS;
    rl_cluster_ask_map(e, i);
}

void rl_cluster_seed_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    rl_engine *e = owner;
    if (t.kind == RL_KIND_TOPOLOGY) rl_cluster_map_reply(e, node, &e->nodes[node], reply, errstr);
}

/* ---- routing ---- */

rl_stream *rl_route(rl_engine *e, int i, int hslot) {
    rl_cluster *c = e->clusters[i];
    if (c == NULL || hslot < 0 || !c->owner[hslot]) return &e->nodes[i];
    return &e->shards[c->owner[hslot] - 1]->st;
}

/* See cluster.h. */
void rl_cluster_name_masters(rl_engine *e, rl_result *res, int hslot) {
    for (int i = 0; i < res->nodes && i < e->nnodes; i++) {
        rl_node_result *n = &res->node[i];
        if (e->clusters[i] == NULL || n->state != RL_NODE_TIMEOUT) continue;
        const rl_stream *s = rl_route(e, i, hslot);
        if (s == &e->nodes[i] || strstr(n->errstr, "(master ") != NULL) continue;
        char address[sizeof(s->url->host) + 8], master[sizeof(address) + 16];
        rl_url_address(s->url, address, sizeof(address));
        int mlen = snprintf(master, sizeof(master), " (master %s)", address);
        size_t len = strlen(n->errstr);
        if (mlen < 0 || len + (size_t)mlen >= sizeof(n->errstr)) continue; /* the text as it is, whole */
        memcpy(n->errstr + len, master, (size_t)mlen + 1);
    }
}

/* Keep a command for node i until its first map is in (asking for it). */
static int wait_for_map(rl_engine *e, int i, int hslot, const char *cmd, size_t len, rl_ticket t) {
    rl_cluster *c = e->clusters[i];
    if (!c->asking) rl_cluster_ask_map(e, i);
    if (!c->asking) { /* no seed can be asked now (every one down): a failed vote, its reason the seed's */
        if (e->nodes[i].errstr[0] == '\0' || strcmp(e->nodes[i].errstr, "not connected") == 0)
            snprintf(e->nodes[i].errstr, sizeof(e->nodes[i].errstr), "cluster map not known: no seed reachable");
        return -1;
    }
    if (c->npend == c->cappend) {
        unsigned cap = c->cappend ? c->cappend * 2 : 16;
        rl_pending *p = realloc(c->pends, cap * sizeof(*p));
        if (p == NULL) goto oom;
        c->pends = p;
        c->cappend = cap;
    }
    if (rl_buf_reserve(&c->pend, len) != 0) goto oom;
    memcpy(c->pend.data + c->pend.len, cmd, len);
    c->pend.len += len;
    c->pends[c->npend++] = (rl_pending){t, hslot, len};
    return 0;
oom:
    snprintf(e->nodes[i].errstr, sizeof(e->nodes[i].errstr), "out of memory");
    return -1;
}

int rl_route_send(rl_engine *e, int i, int hslot, const char *cmd, size_t len, rl_ticket t) {
    rl_cluster *c = e->clusters[i];
    if (c == NULL) return rl_stream_send(&e->nodes[i], cmd, len, t, e->now);
    if (!c->known) return wait_for_map(e, i, hslot, cmd, len, t);
    if (hslot < 0 || !c->owner[hslot]) {
        char slot[64];
        snprintf(slot, sizeof(slot), "hash slot %d is not served", hslot);
        if (c->full) rl_cluster_no_shard(e, slot, e->nodes[i].errstr, sizeof(e->nodes[i].errstr));
        else snprintf(e->nodes[i].errstr, sizeof(e->nodes[i].errstr), "CLUSTERDOWN %s", slot);
        rl_cluster_shard_unreachable(e, i); /* the map again, at most once a while: not per command */
        return -1;
    }
    if (rl_shard_send(e->shards[c->owner[hslot] - 1], cmd, len, t) == 0) return 0;
    rl_cluster_shard_unreachable(e, i);
    return -1;
}

int rl_route_send_pair(rl_engine *e, int i, int hslot, const char *cmd, size_t len, rl_ticket t, const char *cmd2,
                       size_t len2, rl_ticket t2) {
    if (e->clusters[i] == NULL) return rl_stream_send_pair(&e->nodes[i], cmd, len, t, cmd2, len2, t2, e->now);
    if (rl_route_send(e, i, hslot, cmd, len, t) != 0) return -1;
    (void)rl_route_send(e, i, hslot, cmd2, len2, t2); /* the same stream: the map cannot change in between */
    return 0;
}
