/* substream.c — the subscriber streams, one per node (see substream.h;
 * the resources watched are watches.c's). Commands are encoded straight
 * into a node's output buffer, which only ever grows, so a watch costs no
 * allocation beyond its names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream.h"
#include "substream.h"
#include "text.h"

int rl_subs_init(rl_subs *s, const rl_url *urls, int n, const rl_options *opts) {
    memset(s, 0, sizeof(*s));
    s->opts = opts;
    s->nnodes = n;
    size_t plen = strlen(RL_CHANNEL_PREFIX);
    s->head_len = plen + opts->prefix_len;
    s->head = malloc(s->head_len + 1);
    if (s->head == NULL) return -1;
    memcpy(s->head, RL_CHANNEL_PREFIX, plen);
    if (opts->prefix_len) memcpy(s->head + plen, opts->prefix, opts->prefix_len);
    s->head[s->head_len] = '\0';
    for (int i = 0; i < n; i++) rl_subs_add(s, &urls[i]);
    return 0;
}

int rl_subs_add(rl_subs *s, const rl_url *url) {
    if (s->nsubs == RL_MAX_NODES + RL_MAX_SHARDS) return -1;
    int j = s->nsubs++;
    rl_substream *node = &s->nodes[j];
    node->url = url;
    node->state = RL_STREAM_IDLE;
    node->reader.keep = 1;
    node->sharded = j >= s->nnodes;
    snprintf(node->errstr, sizeof(node->errstr), "not connected");
    return j;
}

/* Does stream j serve watch w? */
static int serves(const rl_subs *s, int j, const rl_watched *w) {
    return s->serves == NULL || s->serves(s->owner, j, w);
}

void rl_subs_free(rl_subs *s) {
    for (int i = 0; i < s->nsubs; i++) {
        rl_buf_free(&s->nodes[i].out);
        rl_reader_free(&s->nodes[i].reader);
    }
    for (int id = 0; id < s->nw; id++) {
        free(s->w[id].channel);
        free(s->w[id].wake);
        free(s->w[id].cchannel);
        free(s->w[id].cwake);
    }
    free(s->w);
    free(s->news);
    free(s->head);
    rl_names_free(&s->by_resource);
    rl_names_free(&s->by_channel);
    rl_names_free(&s->by_shard_channel);
    memset(s, 0, sizeof(*s));
}

/* ---- a node's connection ---- */

/* The most bytes one frame may take: a command connection's longest reply
 * string (reply.h), plus the longest channel name, which a message repeats. */
static size_t frame_cap(const rl_subs *s) {
    return RL_REPLY_MAX_STRING + s->longest;
}

static int has_output(const rl_substream *n) {
    return n->state == RL_STREAM_UP && n->out_off < n->out.len;
}

static void connect_now(const rl_subs *s, rl_substream *n, double now_ms) {
    n->state = RL_STREAM_CONNECTING;
    n->handshaking = 0;
    n->connect_by_ms = now_ms + s->opts->connect_timeout_ms;
    n->wants |= RL_WANT_CONNECT;
    snprintf(n->errstr, sizeof(n->errstr), "connecting");
}

/* Forget what the connection had queued or half-read. */
static void clear(rl_substream *n) {
    n->out.len = n->out_off = 0;
    rl_reader_free(&n->reader);
    n->frame_start = 0;
    n->handshaking = 0;
}

/* The connection failed, or is dropped (close_it: the driver still has the
 * socket and is asked to close it): down until the backoff has passed. */
static void fail(const rl_subs *s, rl_substream *n, const char *why, int close_it, double now_ms) {
    if (why != n->errstr) snprintf(n->errstr, sizeof(n->errstr), "%s", why);
    if (close_it) n->wants |= RL_WANT_CLOSE;
    n->wants &= ~RL_WANT_CONNECT;
    clear(n);
    n->backoff_ms = n->backoff_ms ? rl_backoff_next(n->backoff_ms, s->opts->reconnect_max_ms)
                                  : s->opts->reconnect_min_ms;
    n->state = RL_STREAM_DOWN;
    n->retry_at_ms = now_ms + n->backoff_ms;
}

/* Append one bulk string to b. Return 0, or -1 when out of memory. */
static int put_word(rl_buf *b, const char *p, size_t len) {
    char head[32];
    int h = snprintf(head, sizeof(head), "$%zu\r\n", len);
    if (rl_buf_reserve(b, (size_t)h + len + 2) != 0) return -1;
    memcpy(b->data + b->len, head, (size_t)h);
    memcpy(b->data + b->len + h, p, len);
    memcpy(b->data + b->len + h + len, "\r\n", 2);
    b->len += (size_t)h + len + 2;
    return 0;
}

/* Append "*argc" and verb. Return 0, or -1 when out of memory. */
static int put_head(rl_buf *b, int argc, const char *verb) {
    char head[32];
    int h = snprintf(head, sizeof(head), "*%d\r\n", argc);
    if (rl_buf_reserve(b, (size_t)h) != 0) return -1;
    memcpy(b->data + b->len, head, (size_t)h);
    b->len += (size_t)h;
    return put_word(b, verb, strlen(verb));
}

/* Queue verb with the two channels of watch w, or of every watch stream j
 * serves (w NULL: nothing when it serves none) on stream j; a shard's
 * stream sends the sharded verb, one watch per command (a command's
 * channels must share a slot), with the cluster names. Out of memory drops
 * the connection (it starts over after the backoff). Return 0, or -1 then. */
static int put_command(rl_subs *s, int j, const char *verb, const rl_watched *w, double now_ms) {
    rl_substream *n = &s->nodes[j];
    int count = 0, rc = 0;
    for (int id = 0; id < (w ? 1 : s->nw); id++) {
        const rl_watched *x = w ? w : &s->w[id];
        count += (w != NULL || rl_watched_live(x)) && serves(s, j, x);
    }
    if (count == 0) return 0;
    if (!n->sharded) rc = put_head(&n->out, 1 + 2 * count, verb);
    for (int id = 0; rc == 0 && id < (w ? 1 : s->nw); id++) {
        const rl_watched *x = w ? w : &s->w[id];
        if ((w == NULL && !rl_watched_live(x)) || !serves(s, j, x)) continue;
        if (n->sharded) {
            rc = put_head(&n->out, 3, verb[0] == 'S' ? "SSUBSCRIBE" : "SUNSUBSCRIBE");
            if (rc == 0) rc = put_word(&n->out, x->cchannel, x->clen);
            if (rc == 0) rc = put_word(&n->out, x->cwake, x->cwake_len);
        } else {
            rc = put_word(&n->out, x->channel, x->len);
            if (rc == 0) rc = put_word(&n->out, x->wake, x->wake_len);
        }
    }
    if (rc != 0) fail(s, n, "connection reset: out of memory", 1, now_ms);
    return rc;
}

/* A shard's server ended or refused a subscription: one it ended that a
 * live watch still wants (not the answer to our own SUNSUBSCRIBE), or any
 * MOVED (ch NULL), sends the engine to the cluster's map (lost_shard). */
static void shard_lost(rl_subs *s, rl_substream *n, const char *ch, size_t clen) {
    int id = ch ? rl_names_find(&s->by_shard_channel, ch, clen) : -1;
    if ((ch == NULL || (id >= 0 && rl_watched_live(&s->w[id]))) && s->lost_shard)
        s->lost_shard(s->owner, (int)(n - s->nodes), ch == NULL);
}

/* One reply: a release's message counts; confirmations and AUTH's OK pass
 * (a confirmed SUBSCRIBE starts the backoff over); a shard's subscription
 * ended by its server, or refused with MOVED, asks for the map again; any
 * other error reply (a refused AUTH or SUBSCRIBE) drops the connection.
 * Return -1 then, else 0. */
static int on_reply(rl_subs *s, rl_substream *n, const rl_reply *r, double now_ms) {
    if (r->type == RL_REPLY_ERROR && n->sharded && strncmp(r->str, "MOVED ", 6) == 0) {
        shard_lost(s, n, NULL, 0);
        return 0;
    }
    if (r->type == RL_REPLY_ERROR) {
        rl_text_join(n->errstr, sizeof(n->errstr), "refused: ", r->str);
        fail(s, n, n->errstr, 1, now_ms);
        return -1;
    }
    size_t klen = 0, clen = 0, plen = 0;
    const char *kind = rl_reader_element(&n->reader, 0, &klen);
    const char *ch = rl_reader_element(&n->reader, 1, &clen);
    if (r->type != RL_REPLY_ARRAY || r->integer != 3 || kind == NULL || ch == NULL) return 0;
    if ((klen == 7 && memcmp(kind, "message", 7) == 0) || (klen == 8 && memcmp(kind, "smessage", 8) == 0)) {
        const char *payload = rl_reader_element(&n->reader, 2, &plen);
        rl_subs_message(s, ch, clen, payload, plen, n->sharded);
    } else if ((klen == 9 && memcmp(kind, "subscribe", 9) == 0) || (klen == 10 && memcmp(kind, "ssubscribe", 10) == 0)) {
        n->backoff_ms = 0;
    } else if (n->sharded && klen == 12 && memcmp(kind, "sunsubscribe", 12) == 0) {
        shard_lost(s, n, ch, clen);
    }
    return 0;
}

/* ---- what the driver reports, and what it is asked ---- */

int rl_subs_take_wants(rl_subs *s, int i, double now_ms) {
    rl_substream *n = &s->nodes[i];
    int w = n->wants;
    n->wants = 0;
    /* the connect begins now, however long after the ask (rl_stream_take_wants) */
    if ((w & RL_WANT_CONNECT) && n->state == RL_STREAM_CONNECTING &&
        now_ms + s->opts->connect_timeout_ms > n->connect_by_ms)
        n->connect_by_ms = now_ms + s->opts->connect_timeout_ms;
    return has_output(n) ? w | RL_WANT_WRITE : w;
}

int rl_subs_wanting(const rl_subs *s, int i) {
    return s->nodes[i].wants != 0 || has_output(&s->nodes[i]);
}

void rl_subs_open(rl_subs *s, int i, double now_ms) {
    rl_substream *n = &s->nodes[i];
    if (s->used > 0 && n->state != RL_STREAM_UP && n->state != RL_STREAM_CONNECTING) connect_now(s, n, now_ms);
}

int rl_subs_connected(rl_subs *s, int i, double now_ms) {
    rl_substream *n = &s->nodes[i];
    if (n->state != RL_STREAM_CONNECTING) return -1;
    n->wants &= ~RL_WANT_CONNECT;
    clear(n);
    n->reader.max_string = frame_cap(s);
    if (rl_reader_reset(&n->reader) != 0 || rl_cmd_auth(&n->out, n->url->user, n->url->password) < 0) {
        fail(s, n, "connect failed: out of memory", 1, now_ms);
        return 0;
    }
    n->state = RL_STREAM_UP;
    n->errstr[0] = '\0';
    put_command(s, i, "SUBSCRIBE", NULL, now_ms);
    return 0;
}

void rl_subs_handshaking(rl_subs *s, int i) {
    if (s->nodes[i].state == RL_STREAM_CONNECTING) s->nodes[i].handshaking = 1;
}

void rl_subs_down(rl_subs *s, int i, const char *why, double now_ms) {
    rl_substream *n = &s->nodes[i];
    if (n->state == RL_STREAM_UP || n->state == RL_STREAM_CONNECTING)
        fail(s, n, why && *why ? why : "connection lost", 0, now_ms);
}

int rl_subs_restart(rl_subs *s, int i) {
    rl_substream *n = &s->nodes[i];
    int had = n->state == RL_STREAM_UP || n->state == RL_STREAM_CONNECTING || (n->wants & RL_WANT_CLOSE);
    clear(n);
    n->state = RL_STREAM_IDLE;
    n->wants = had ? RL_WANT_CLOSE : 0;
    n->backoff_ms = 0;
    n->retry_at_ms = n->connect_by_ms = 0;
    snprintf(n->errstr, sizeof(n->errstr), "not connected");
    return had;
}

int rl_subs_detach(rl_subs *s, int i, double now_ms) {
    rl_substream *n = &s->nodes[i];
    if (n->state != RL_STREAM_UP && n->state != RL_STREAM_CONNECTING) return 0;
    n->wants &= ~(RL_WANT_CONNECT | RL_WANT_CLOSE);
    clear(n);
    n->state = RL_STREAM_IDLE;
    snprintf(n->errstr, sizeof(n->errstr), "connection detached");
    rl_subs_open(s, i, now_ms);
    return 0;
}

size_t rl_subs_output(const rl_subs *s, int i, const char **data) {
    const rl_substream *n = &s->nodes[i];
    if (n->state != RL_STREAM_UP) return 0;
    *data = n->out.data + n->out_off;
    return n->out.len - n->out_off;
}

void rl_subs_wrote(rl_subs *s, int i, size_t len) {
    rl_substream *n = &s->nodes[i];
    if (n->state != RL_STREAM_UP) return;
    n->out_off += len < n->out.len - n->out_off ? len : n->out.len - n->out_off;
    if (n->out_off == n->out.len) n->out.len = n->out_off = 0;
}

int rl_subs_feed(rl_subs *s, int i, const char *data, size_t len, double now_ms) {
    rl_substream *n = &s->nodes[i];
    if (n->state != RL_STREAM_UP) return -1;
    size_t cap = frame_cap(s);
    n->reader.max_string = cap; /* the cap grows with the names watched */
    if (rl_reader_feed(&n->reader, data, len) != 0) {
        fail(s, n, "connection lost: out of memory", 1, now_ms);
        return -1;
    }
    for (;;) {
        const rl_reply *r = NULL;
        int got = rl_reader_next(&n->reader, &r);
        if (got < 0) {
            rl_text_join(n->errstr, sizeof(n->errstr), "connection reset: ", rl_reader_error(&n->reader));
            fail(s, n, n->errstr, 1, now_ms);
            return -1;
        }
        /* where the frame ends: complete, where the reader stopped; not yet,
         * every byte fed so far is in it (so it is refused as soon as the
         * cap is passed, never buffered whole) */
        unsigned long long end = got ? rl_reader_consumed(&n->reader) : n->reader.fed;
        if (end - n->frame_start > cap) {
            snprintf(n->errstr, sizeof(n->errstr), "connection reset: a frame over %zu bytes", cap);
            fail(s, n, n->errstr, 1, now_ms);
            return -1;
        }
        if (got == 0) return 0;
        n->frame_start = end;
        if (on_reply(s, n, r, now_ms) != 0) return -1;
    }
}

/* (a connect asked for and not taken by the driver yet has not begun: no deadline) */
static double node_deadline(const rl_substream *n) {
    if (n->state == RL_STREAM_CONNECTING) return (n->wants & RL_WANT_CONNECT) ? 0 : n->connect_by_ms;
    return n->state == RL_STREAM_DOWN ? n->retry_at_ms : 0;
}

double rl_subs_deadline(const rl_subs *s) {
    double at = s->linger_next;
    for (int i = 0; i < s->nsubs; i++) {
        double d = node_deadline(&s->nodes[i]);
        if (d > 0 && (at == 0 || d < at)) at = d;
    }
    return at;
}

void rl_subs_advance(rl_subs *s, double now_ms) {
    rl_subs_linger_advance(s, now_ms);
    for (int i = 0; i < s->nsubs; i++) {
        rl_substream *n = &s->nodes[i];
        double due = node_deadline(n);
        if (due == 0 || now_ms < due) continue;
        if (n->state == RL_STREAM_DOWN) {
            n->state = RL_STREAM_IDLE; /* reconnect, if anything is watched */
            rl_subs_open(s, i, now_ms);
        } else {
            snprintf(n->errstr, sizeof(n->errstr), "%s timed out after %d ms",
                     n->handshaking ? "TLS handshake" : "connect", s->opts->connect_timeout_ms);
            fail(s, n, n->errstr, 1, now_ms);
        }
    }
}

void rl_subs_rerouted(rl_subs *s, double now_ms) {
    for (int id = 0; id < s->nw; id++)
        if (rl_watched_live(&s->w[id])) rl_subs_changed(s, &s->w[id], 1, now_ms);
}

void rl_subs_changed(rl_subs *s, const rl_watched *w, int subscribe, double now_ms) {
    for (int i = 0; i < s->nsubs; i++) {
        rl_substream *n = &s->nodes[i];
        if (!serves(s, i, w)) continue;
        if (n->state == RL_STREAM_UP) {
            put_command(s, i, subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", w, now_ms);
        } else if (subscribe && n->state == RL_STREAM_IDLE) {
            connect_now(s, n, now_ms);
        } else if (!subscribe && s->used == 0 && n->state == RL_STREAM_CONNECTING && (n->wants & RL_WANT_CONNECT)) {
            n->wants &= ~RL_WANT_CONNECT; /* nothing watched: a connection not begun is not needed */
            n->state = RL_STREAM_IDLE;
        }
    }
}

int rl_subs_listening(const rl_subs *s) {
    int up = 0;
    for (int i = 0; i < s->nsubs; i++) up += s->nodes[i].state == RL_STREAM_UP;
    return up;
}

