/* notify.c — subscriber connections of the libev client (see notify.h).
 *
 * Per node: a socket of its own (conn.c; TLS for a rediss:// node, with the
 * client's context, the handshake bounded by the connect timeout), AUTH when
 * the URL has a password, then one SUBSCRIBE for every channel watched;
 * messages are parsed by hiredis' reader and counted per channel when they
 * are a release's (see notify.h). Whatever goes wrong (refused connect, lost
 * connection, a failed handshake, refused AUTH, garbage, a frame over the
 * cap) closes the socket and tries again after a doubling backoff: a node
 * that is down costs its wake-ups, never a wait. */
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "command.h"
#include "conn.h"
#include "notify.h"
#include "reply.h"
#include "stream.h"


typedef struct rl_sub {
    rl_conn conn;
    ev_io readable;
    ev_io writable;
    ev_timer timer;          /* connect deadline while connecting; the backoff while down */
    struct rl_notify *n;
    int index;
    int opened;              /* conn initialised (its lookup begun) */
    int up;                  /* connected: output goes out as it is queued */
    int backoff_ms;          /* the next retry's delay (0: the first failure) */
    int read_wants_write;    /* TLS: the last read waits for the socket to be writable */
    redisReader *reader;
    unsigned long long fed;  /* bytes fed to the reader on this connection */
    unsigned long long frame_start; /* where the frame being read began: the end of the last one */
    rl_buf out;              /* bytes not written yet */
} rl_sub;

typedef struct rl_chan {
    char *channel;           /* RL_CHANNEL_PREFIX prefix resource: every listener */
    size_t len;
    char *wake;              /* RL_WAKE_PREFIX id ":" prefix resource: this client, from the queue */
    size_t wake_len;
    int waiters;
    unsigned heard;
    int listeners;           /* clients listening at the last release heard (its message); 0: unknown */
} rl_chan;

struct rl_notify {
    struct ev_loop *loop;
    int nnodes;
    int started;             /* connections asked for (the first watch) */
    int min_ms, max_ms, connect_ms;
    char *head;              /* RL_CHANNEL_PREFIX prefix */
    size_t head_len;
    char *wake_head;         /* RL_WAKE_PREFIX id ":" prefix */
    size_t wake_head_len;
    rl_chan *w;
    int nw, capw;
    size_t longest;          /* the longest channel name watched so far */
    unsigned total;
    rl_sub subs[RL_MAX_NODES];
};

static void sub_connect(rl_sub *s);
static void sub_up(rl_sub *s);

static void sub_close(rl_sub *s) {
    ev_io_stop(s->n->loop, &s->readable);
    ev_io_stop(s->n->loop, &s->writable);
    ev_timer_stop(s->n->loop, &s->timer);
    rl_conn_close(&s->conn);
    if (s->reader) redisReaderFree(s->reader);
    s->reader = NULL;
    s->up = 0;
    s->read_wants_write = 0;
    s->out.len = 0;
}

/* Down: close and try again after the backoff. */
static void sub_fail(rl_sub *s) {
    rl_notify *n = s->n;
    sub_close(s);
    s->backoff_ms = s->backoff_ms ? rl_backoff_next(s->backoff_ms, n->max_ms) : n->min_ms;
    ev_timer_set(&s->timer, s->backoff_ms / 1000.0, 0.);
    ev_timer_start(n->loop, &s->timer);
}

/* Write what is queued; what does not fit waits for the socket's room (a
 * TLS write waiting to read is taken up again by the next read). */
static void sub_flush(rl_sub *s) {
    while (s->up && s->out.len > 0) {
        ssize_t w = rl_conn_write(&s->conn, s->out.data, s->out.len);
        if (w > 0) {
            memmove(s->out.data, s->out.data + w, s->out.len - (size_t)w);
            s->out.len -= (size_t)w;
        } else if (w == RL_CONN_AGAIN) {
            if (s->conn.want == RL_TLS_WANT_WRITE) ev_io_start(s->n->loop, &s->writable);
            return;
        } else {
            sub_fail(s);
            return;
        }
    }
    if (s->up && !s->read_wants_write) ev_io_stop(s->n->loop, &s->writable);
}

/* Queue verb with the channels of a watch (one, or every one when ch is
 * NULL): its resource's and its wake channel. Out of memory: the connection
 * starts over later. */
static void sub_queue(rl_sub *s, const char *verb, const rl_chan *ch) {
    rl_notify *n = s->n;
    int count = ch ? 1 : n->nw;
    if (count == 0) return;
    const char **argv = malloc((size_t)(2 * count + 1) * sizeof(*argv));
    size_t *lens = malloc((size_t)(2 * count + 1) * sizeof(*lens));
    int rc = -1;
    if (argv && lens) {
        argv[0] = verb;
        lens[0] = strlen(verb);
        for (int i = 0; i < count; i++) {
            const rl_chan *w = ch ? ch : &n->w[i];
            argv[2 * i + 1] = w->channel;
            lens[2 * i + 1] = w->len;
            argv[2 * i + 2] = w->wake;
            lens[2 * i + 2] = w->wake_len;
        }
        rc = rl_cmd_append_argv(&s->out, 2 * count + 1, argv, lens);
    }
    free(argv);
    free(lens);
    if (rc != 0) sub_fail(s);
}

/* Take a TLS handshake a step; done: the subscriber is up. */
static void sub_handshake(rl_sub *s) {
    rl_notify *n = s->n;
    int rc = rl_conn_handshake(&s->conn);
    if (rc == RL_CONN_FAIL) {
        sub_fail(s);
        return;
    }
    if (rc == RL_CONN_AGAIN) {
        if (s->conn.want == RL_TLS_WANT_READ) {
            ev_io_stop(n->loop, &s->writable);
            ev_io_start(n->loop, &s->readable);
        } else {
            ev_io_stop(n->loop, &s->readable);
            ev_io_start(n->loop, &s->writable);
        }
        return;
    }
    ev_io_stop(n->loop, &s->readable);
    ev_io_stop(n->loop, &s->writable);
    ev_timer_stop(n->loop, &s->timer);
    sub_up(s);
}

static void sub_connected(rl_sub *s) {
    rl_notify *n = s->n;
    ev_io_stop(n->loop, &s->writable);
    if (rl_conn_finish_connect(&s->conn) != 0) {
        sub_fail(s);
        return;
    }
    if (s->conn.handshaking) {
        ev_io_set(&s->readable, s->conn.fd, EV_READ);
        sub_handshake(s); /* the connect deadline (the timer) bounds it */
        return;
    }
    ev_timer_stop(n->loop, &s->timer);
    sub_up(s);
}

/* Connected (and through TLS): AUTH, SUBSCRIBE, and listen. */
static void sub_up(rl_sub *s) {
    rl_notify *n = s->n;
    s->reader = redisReaderCreate();
    if (s->reader == NULL) {
        sub_fail(s);
        return;
    }
    s->up = 1;
    s->fed = s->frame_start = 0;
    s->out.len = 0;
    if (rl_cmd_auth(&s->out, s->conn.url->user, s->conn.url->password) < 0) {
        sub_fail(s);
        return;
    }
    sub_queue(s, "SUBSCRIBE", NULL);
    if (!s->up) return;
    ev_io_set(&s->readable, s->conn.fd, EV_READ);
    ev_io_set(&s->writable, s->conn.fd, EV_WRITE);
    ev_io_start(n->loop, &s->readable);
    sub_flush(s);
}

/* The watch a message's channel belongs to, or NULL; *wake: 1 if it is the
 * watch's wake channel, 0 if its resource's. */
static rl_chan *find(const rl_notify *n, const char *channel, size_t len, int *wake) {
    for (int i = 0; i < n->nw; i++) {
        rl_chan *w = &n->w[i];
        *wake = w->wake_len == len && memcmp(w->wake, channel, len) == 0;
        if (*wake || (w->len == len && memcmp(w->channel, channel, len) == 0)) return w;
    }
    return NULL;
}

/* What a message says if it is a release's (notify.h): on a resource's
 * channel the clients that listened, a positive decimal number (no sign, no
 * leading zero, at most 9 digits); on a wake channel "1", which says 1.
 * 0: it is not a release's message. */
static int release_says(const redisReply *payload, int wake) {
    if (payload->type != REDIS_REPLY_STRING || payload->len == 0 || payload->len > 9 || payload->str[0] == '0')
        return 0;
    if (wake) return payload->len == 1 && payload->str[0] == '1';
    int v = 0;
    for (size_t i = 0; i < payload->len; i++) {
        if (payload->str[i] < '0' || payload->str[i] > '9') return 0;
        v = v * 10 + (payload->str[i] - '0');
    }
    return v;
}

/* One reply: a release's message on a watched channel counts (any other
 * message is ignored); confirmations and AUTH's OK pass; an error (a refused
 * AUTH) ends the connection. Return -1 then. */
static int on_reply(rl_sub *s, const redisReply *r) {
    if (r->type == REDIS_REPLY_ERROR) return -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        const redisReply *kind = r->element[0], *ch = r->element[1];
        if (kind->len == 7 && memcmp(kind->str, "message", 7) == 0) {
            int wake;
            rl_chan *w = find(s->n, ch->str, ch->len, &wake);
            int says = w ? release_says(r->element[2], wake) : 0;
            if (says > 0) {
                w->heard++;
                s->n->total++;
                w->listeners = says;
            }
        } else if (kind->len == 9 && memcmp(kind->str, "subscribe", 9) == 0) {
            s->backoff_ms = 0; /* a working connection: the next failure starts the backoff over */
        }
    }
    return 0;
}

/* The most bytes one frame (a message, a confirmation) may take: as a
 * command connection's reply (reply.h), plus the longest channel name
 * watched, which a message repeats. */
static size_t frame_cap(const rl_notify *n) {
    return RL_REPLY_MAX_STRING + n->longest;
}

/* Bytes read from a subscriber: parsed, each reply handled; nonzero when
 * the connection must end (garbage, a refused AUTH, a frame over
 * frame_cap: found as soon as that many of its bytes are in, so the reader
 * never holds more than the cap and one read). */
static int take_replies(void *arg, const char *data, size_t len) {
    rl_sub *s = arg;
    if (redisReaderFeed(s->reader, data, len) != REDIS_OK) return 1;
    s->fed += len;
    void *r;
    for (;;) {
        if (redisReaderGetReply(s->reader, &r) != REDIS_OK) return 1;
        /* where the frame ends (complete: where the reader stopped; not
         * yet: every byte fed so far is in it) */
        unsigned long long end = r ? s->fed - (s->reader->len - s->reader->pos) : s->fed;
        if (end - s->frame_start > frame_cap(s->n)) {
            if (r) freeReplyObject(r);
            return 1;
        }
        if (r == NULL) return 0;
        s->frame_start = end;
        int rc = on_reply(s, r);
        freeReplyObject(r);
        if (rc != 0) return 1;
    }
}

static void sub_read(rl_sub *s) {
    s->read_wants_write = 0;
    int rc = rl_conn_drain(&s->conn, take_replies, s);
    if (rc != RL_CONN_AGAIN) {
        sub_fail(s);
    } else if (s->conn.want == RL_TLS_WANT_WRITE) {
        s->read_wants_write = 1;
        ev_io_start(s->n->loop, &s->writable);
    }
}

static void on_readable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_sub *s = w->data;
    if (s->conn.handshaking) {
        sub_handshake(s);
        return;
    }
    sub_read(s);
    if (s->up && s->out.len > 0) sub_flush(s); /* a TLS write may have waited to read */
}

static void on_writable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_sub *s = w->data;
    if (s->conn.connecting) {
        sub_connected(s);
    } else if (s->conn.handshaking) {
        sub_handshake(s);
    } else {
        int read_too = s->read_wants_write;
        s->read_wants_write = 0;
        sub_flush(s);
        if (read_too && s->up) sub_read(s);
    }
}

/* The connect deadline passed, or the backoff ran out. */
static void on_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_sub *s = w->data;
    if (s->conn.connecting || s->conn.handshaking) sub_fail(s);
    else if (!s->up) sub_connect(s);
}

static void sub_connect(rl_sub *s) {
    rl_notify *n = s->n;
    sub_close(s);
    if (!s->opened) {
        rl_conn_init(&s->conn, s->conn.url, s->conn.tls);
        s->opened = 1;
    }
    if (rl_conn_open(&s->conn) != 0) {
        sub_fail(s);
        return;
    }
    ev_io_set(&s->writable, s->conn.fd, EV_WRITE);
    ev_io_start(n->loop, &s->writable);
    ev_timer_set(&s->timer, n->connect_ms / 1000.0, 0.);
    ev_timer_start(n->loop, &s->timer);
}

/* head .. tail (tail binary-safe, tlen bytes), with its length in *len;
 * NULL when out of memory. Callers keep tlen within RL_MAX_KEY_LEN. */
static char *join(const char *head, size_t hlen, const char *tail, size_t tlen, size_t *len) {
    *len = hlen + tlen;
    char *p = malloc(*len + 1);
    if (p == NULL) return NULL;
    memcpy(p, head, hlen);
    if (tlen) memcpy(p + hlen, tail, tlen);
    p[*len] = '\0';
    return p;
}

rl_notify *rl_notify_new(struct ev_loop *loop, const rl_engine *e, const rl_options *opts, rl_tls *tls) {
    rl_notify *n = calloc(1, sizeof(*n));
    if (n == NULL) return NULL;
    char wake[sizeof(RL_WAKE_PREFIX) + RL_WAITER_ID_LEN + 1];
    int wlen = snprintf(wake, sizeof(wake), "%s%s:", RL_WAKE_PREFIX, rl_engine_waiter_id(e));
    n->head = join(RL_CHANNEL_PREFIX, strlen(RL_CHANNEL_PREFIX), opts->prefix, opts->prefix_len, &n->head_len);
    n->wake_head = join(wake, (size_t)wlen, opts->prefix, opts->prefix_len, &n->wake_head_len);
    if (n->head == NULL || n->wake_head == NULL) {
        free(n->head);
        free(n->wake_head);
        free(n);
        return NULL;
    }
    n->loop = loop;
    n->nnodes = rl_engine_nodes(e);
    n->min_ms = opts->reconnect_min_ms;
    n->max_ms = opts->reconnect_max_ms;
    n->connect_ms = opts->connect_timeout_ms;
    for (int i = 0; i < n->nnodes; i++) {
        rl_sub *s = &n->subs[i];
        s->n = n;
        s->index = i;
        s->conn.fd = -1;
        s->conn.url = rl_engine_node_url(e, i);
        s->conn.tls = rl_engine_node_tls(e, i) ? tls : NULL;
        ev_io_init(&s->readable, on_readable, -1, EV_READ);
        ev_io_init(&s->writable, on_writable, -1, EV_WRITE);
        ev_timer_init(&s->timer, on_timer, 0., 0.);
        s->readable.data = s->writable.data = s->timer.data = s;
    }
    return n;
}

void rl_notify_free(rl_notify *n) {
    if (n == NULL) return;
    for (int i = 0; i < n->nnodes; i++) {
        rl_sub *s = &n->subs[i];
        sub_close(s);
        if (s->opened) rl_conn_free(&s->conn);
        rl_buf_free(&s->out);
    }
    for (int i = 0; i < n->nw; i++) {
        free(n->w[i].channel);
        free(n->w[i].wake);
    }
    free(n->w);
    free(n->head);
    free(n->wake_head);
    free(n);
}

/* The watch of resource, or NULL (always for a name no key could hold). */
static rl_chan *watched(const rl_notify *n, const char *resource, size_t len) {
    if (len > RL_MAX_KEY_LEN) return NULL;
    size_t need = n->head_len + len;
    for (int i = 0; i < n->nw; i++) {
        rl_chan *w = &n->w[i];
        if (w->len == need && memcmp(w->channel, n->head, n->head_len) == 0 &&
            (len == 0 || memcmp(w->channel + n->head_len, resource, len) == 0))
            return w;
    }
    return NULL;
}

int rl_notify_watch(rl_notify *n, const char *resource, size_t len) {
    if (len > RL_MAX_KEY_LEN) return RL_ERR;
    rl_chan *w = watched(n, resource, len);
    if (w) {
        w->waiters++;
        return RL_OK;
    }
    if (n->nw == n->capw) {
        int cap = n->capw ? n->capw * 2 : 8;
        rl_chan *p = realloc(n->w, (size_t)cap * sizeof(*p));
        if (p == NULL) return RL_ERR;
        n->w = p;
        n->capw = cap;
    }
    size_t ch_len, wake_len;
    char *ch = join(n->head, n->head_len, resource, len, &ch_len);
    char *wake = join(n->wake_head, n->wake_head_len, resource, len, &wake_len);
    if (ch == NULL || wake == NULL) {
        free(ch);
        free(wake);
        return RL_ERR;
    }
    w = &n->w[n->nw++];
    *w = (rl_chan){ch, ch_len, wake, wake_len, 1, 0, 0};
    if (wake_len > n->longest) n->longest = wake_len;
    if (ch_len > n->longest) n->longest = ch_len;
    if (!n->started) {
        n->started = 1;
        for (int i = 0; i < n->nnodes; i++) sub_connect(&n->subs[i]);
        return RL_OK;
    }
    for (int i = 0; i < n->nnodes; i++) {
        rl_sub *s = &n->subs[i];
        if (!s->up) continue;
        sub_queue(s, "SUBSCRIBE", w);
        sub_flush(s);
    }
    return RL_OK;
}

void rl_notify_unwatch(rl_notify *n, const char *resource, size_t len) {
    rl_chan *w = watched(n, resource, len);
    if (w == NULL || --w->waiters > 0) return;
    for (int i = 0; i < n->nnodes; i++) {
        rl_sub *s = &n->subs[i];
        if (!s->up) continue;
        sub_queue(s, "UNSUBSCRIBE", w);
        sub_flush(s);
    }
    free(w->channel);
    free(w->wake);
    *w = n->w[--n->nw];
}

unsigned rl_notify_heard(const rl_notify *n, const char *resource, size_t len) {
    if (resource == NULL) return n->total;
    const rl_chan *w = watched(n, resource, len);
    return w ? w->heard : 0;
}

int rl_notify_listeners(const rl_notify *n, const char *resource, size_t len) {
    if (resource != NULL) {
        const rl_chan *w = watched(n, resource, len);
        return w ? w->listeners : 0;
    }
    int most = 0;
    for (int i = 0; i < n->nw; i++)
        if (n->w[i].listeners > most) most = n->w[i].listeners;
    return most;
}

int rl_notify_up(const rl_notify *n) {
    int up = 0;
    for (int i = 0; i < n->nnodes; i++) up += n->subs[i].up;
    return up;
}
