/* evsock.c — one engine link's socket on a libev loop (see evsock.h). */
#include <poll.h>
#include <string.h>

#include "evsock.h"
#include "text.h"

/* ---- the watchers: starting and stopping is safe to repeat ---- */

static void add_read(rl_evsock *s) {
    if (!ev_is_active(&s->readable)) ev_io_start(s->loop, &s->readable);
}

static void del_read(rl_evsock *s) {
    if (ev_is_active(&s->readable)) ev_io_stop(s->loop, &s->readable);
}

static void add_write(rl_evsock *s) {
    if (!ev_is_active(&s->writable)) ev_io_start(s->loop, &s->writable);
}

static void del_write(rl_evsock *s) {
    if (ev_is_active(&s->writable)) ev_io_stop(s->loop, &s->writable);
}

/* Point both (stopped) watchers at the socket. */
static void set_fd(rl_evsock *s) {
    del_read(s);
    del_write(s);
    ev_io_set(&s->readable, s->conn.fd, EV_READ);
    ev_io_set(&s->writable, s->conn.fd, EV_WRITE);
}

/* ---- the socket ---- */

void rl_evsock_close(rl_evsock *s) {
    del_read(s);
    del_write(s);
    if (ev_is_active(&s->resolving)) ev_timer_stop(s->loop, &s->resolving);
    rl_conn_close(&s->conn);
    s->read_wants_write = s->write_wants_read = 0;
}

void rl_evsock_lookup(rl_evsock *s) {
    if (s->opened) return;
    rl_conn_init(&s->conn, s->url, s->tls);
    s->opened = 1;
}

#define RESOLVE_LOOK_MIN_S 0.001 /* a lookup still running is looked at again after 1 ms, */
#define RESOLVE_LOOK_MAX_S 0.032 /* then after twice as long each time, up to this */

/* The first lookup has finished: connect (or say why not); else look again later. */
static void on_resolving(EV_P_ ev_timer *w, int revents) {
    (void)revents;
    rl_evsock *s = w->data;
    ev_timer_stop(loop, w);
    if (rl_conn_first_lookup_running(&s->conn)) {
        double next = w->repeat * 2 < RESOLVE_LOOK_MAX_S ? w->repeat * 2 : RESOLVE_LOOK_MAX_S;
        ev_timer_set(w, next, next);
        ev_timer_start(loop, w);
        return;
    }
    rl_evsock_connect(s);
    s->after(s->owner);
}

void rl_evsock_connect(rl_evsock *s) {
    rl_evsock_lookup(s);
    rl_evsock_close(s);
    if (rl_conn_first_lookup_running(&s->conn)) {
        ev_timer_set(&s->resolving, RESOLVE_LOOK_MIN_S, RESOLVE_LOOK_MIN_S);
        ev_timer_start(s->loop, &s->resolving);
        return;
    }
    if (rl_conn_open(&s->conn) != 0) {
        rl_engine_node_down(s->engine, s->link, s->conn.errstr, rl_now_ms());
        return;
    }
    set_fd(s);
    add_write(s);
}

/* The socket failed or ended: close it and tell the engine why. */
static void lost(rl_evsock *s, const char *prefix, const char *text) {
    char why[RL_NODE_ERR_LEN];
    rl_text_join(why, sizeof(why), prefix, text);
    rl_evsock_close(s);
    rl_engine_node_down(s->engine, s->link, why, rl_now_ms());
}

void rl_evsock_flush(rl_evsock *s) {
    if (s->conn.fd < 0 || s->conn.connecting || s->conn.handshaking) return;
    s->write_wants_read = 0;
    for (;;) {
        const char *data;
        size_t len = rl_engine_node_output(s->engine, s->link, &data);
        if (len == 0) {
            if (!s->read_wants_write) del_write(s);
            return;
        }
        ssize_t w = rl_conn_write(&s->conn, data, len);
        if (w > 0) {
            rl_engine_node_wrote(s->engine, s->link, (size_t)w, rl_now_ms());
        } else if (w == RL_CONN_AGAIN) {
            if (s->conn.want == RL_TLS_WANT_READ) s->write_wants_read = 1; /* readable is on */
            else add_write(s);
            return;
        } else {
            lost(s, "connection lost: ", s->conn.errstr);
            return;
        }
    }
}

/* The connection is up (and through TLS): tell the engine, read, and write
 * what it queues at once, unless flush is 0 (the caller reads first). */
static void up(rl_evsock *s, int flush) {
    del_read(s);
    del_write(s);
    if (rl_engine_node_connected(s->engine, s->link, 1, rl_now_ms()) != RL_OK) {
        rl_evsock_close(s);
        return;
    }
    add_read(s);
    if (flush) rl_evsock_flush(s);
}

/* Take the handshake a step; when it is done, the connection is up. */
static void handshake_as(rl_evsock *s, int after_gap) {
    int rc = rl_conn_handshake(&s->conn);
    if (rc == RL_CONN_FAIL) {
        rl_evsock_close(s);
        /* after a gap: a handshake begun before it, that nobody drove, may
         * have outlived the server's idle timeout */
        if (after_gap) rl_engine_node_closed_unused(s->engine, s->link, s->conn.errstr, rl_now_ms());
        else rl_engine_node_down(s->engine, s->link, s->conn.errstr, rl_now_ms());
    } else if (rc == RL_CONN_AGAIN && s->conn.want == RL_TLS_WANT_READ) {
        del_write(s);
        add_read(s);
    } else if (rc == RL_CONN_AGAIN) {
        del_read(s);
        add_write(s);
    } else {
        up(s, 1);
    }
}

static void handshake(rl_evsock *s) {
    handshake_as(s, 0);
}

/* The connect has ended: up, or on to the TLS handshake (after_gap: see
 * handshake_as), or failed. */
static void connected_as(rl_evsock *s, int flush, int after_gap) {
    del_write(s);
    if (rl_conn_finish_connect(&s->conn) != 0) {
        rl_engine_node_down(s->engine, s->link, s->conn.errstr, rl_now_ms());
    } else if (s->conn.handshaking) {
        rl_engine_node_handshaking(s->engine, s->link);
        handshake_as(s, after_gap);
    } else {
        up(s, flush);
    }
}

static void connected(rl_evsock *s, int flush) {
    connected_as(s, flush, 0);
}

/* Bytes read, to the engine; nonzero when it has dropped the connection. */
static int feed(void *arg, const char *data, size_t len) {
    rl_evsock *s = arg;
    return rl_engine_node_feed(s->engine, s->link, data, len, rl_now_ms()) != RL_OK;
}

/* Read and feed everything the socket has. */
static void drain(rl_evsock *s) {
    s->read_wants_write = 0;
    int rc = rl_conn_drain(&s->conn, feed, s);
    if (rc == RL_CONN_FAIL) {
        lost(s, "connection lost: ", s->conn.errstr);
    } else if (rc == RL_CONN_AGAIN && s->conn.want == RL_TLS_WANT_WRITE) {
        s->read_wants_write = 1;
        add_write(s);
    }
}

static void on_readable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_evsock *s = w->data;
    if (s->conn.handshaking) {
        handshake(s);
    } else {
        drain(s);
        if (s->write_wants_read && s->conn.fd >= 0) rl_evsock_flush(s);
    }
    s->after(s->owner);
}

static void on_writable(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_evsock *s = w->data;
    if (s->conn.connecting) {
        connected(s, 1);
    } else if (s->conn.handshaking) {
        handshake(s);
    } else {
        int read_too = s->read_wants_write;
        s->read_wants_write = 0;
        rl_evsock_flush(s);
        if (read_too && s->conn.fd >= 0) drain(s);
    }
    s->after(s->owner);
}

void rl_evsock_init(rl_evsock *s, struct ev_loop *loop, rl_engine *e, int link, const rl_url *url, rl_tls *tls,
                    void (*after)(void *owner), void *owner) {
    memset(&s->conn, 0, sizeof(s->conn));
    s->conn.fd = -1;
    s->opened = 0;
    s->url = url;
    s->tls = tls;
    s->loop = loop;
    s->engine = e;
    s->link = link;
    s->read_wants_write = s->write_wants_read = 0;
    s->after = after;
    s->owner = owner;
    ev_io_init(&s->readable, on_readable, -1, EV_READ);
    ev_io_init(&s->writable, on_writable, -1, EV_WRITE);
    ev_timer_init(&s->resolving, on_resolving, 0., 0.);
    s->readable.data = s->writable.data = s->resolving.data = s;
}

static void take_ready_of(rl_evsock *socks, int n, unsigned which, int after_gap);

static void take_ready(rl_evsock *socks, int n, int after_gap) {
    take_ready_of(socks, n, ~0u, after_gap);
    for (int i = 0; i < n; i++) {
        rl_evsock *s = &socks[i];
        if (s->conn.fd >= 0 && !s->conn.connecting && !s->conn.handshaking)
            rl_engine_node_unsent(s->engine, s->link, rl_conn_unsent(&s->conn));
    }
}

void rl_evsock_take_ready(rl_evsock *socks, int n) {
    take_ready(socks, n, 0);
}

void rl_evsock_take_after_gap(rl_evsock *socks, int n) {
    take_ready(socks, n, 1);
}

void rl_evsock_take_ready_of(rl_evsock *socks, int n, unsigned which) {
    take_ready_of(socks, n, which, 0);
}

static void take_ready_of(rl_evsock *socks, int n, unsigned which, int after_gap) {
    struct pollfd p[RL_MAX_LINKS];
    int idx[RL_MAX_LINKS], k = 0;
    for (int i = 0; i < n && k < RL_MAX_LINKS; i++) {
        rl_evsock *s = &socks[i];
        if (s->conn.fd < 0 || (i < 32 && !(which & (1u << i)))) continue;
        /* (a connect made long ago may have been closed since: POLLIN too) */
        short ev = s->conn.connecting ? POLLOUT | POLLIN : POLLIN;
        if (s->conn.handshaking && s->conn.want == RL_TLS_WANT_WRITE) ev = POLLOUT;
        p[k] = (struct pollfd){.fd = s->conn.fd, .events = ev};
        idx[k++] = i;
    }
    int ready = k > 0 && poll(p, (nfds_t)k, 0) > 0;
    for (int j = 0; ready && j < k; j++) {
        rl_evsock *s = &socks[idx[j]];
        if (!p[j].revents || s->conn.fd != p[j].fd) continue;
        if (s->conn.connecting) {
            /* a connect made long ago that the server has closed since (it
             * sends nothing first): its end is read before anything is
             * written, so that the engine makes a new one at once */
            int closed_since = (p[j].revents & (POLLIN | POLLHUP)) != 0;
            connected_as(s, !closed_since, after_gap);
            if (closed_since && s->conn.fd == p[j].fd && !s->conn.connecting && !s->conn.handshaking) {
                drain(s);
                if (s->conn.fd >= 0) rl_evsock_flush(s);
            }
        } else if (s->conn.handshaking) {
            handshake_as(s, after_gap);
        } else {
            drain(s);
        }
    }
}

void rl_evsock_disown(rl_evsock *s) {
    s->conn.session.failed = 1; /* rl_tls_end sends no close_notify then */
    rl_evsock_free(s);
}

void rl_evsock_free(rl_evsock *s) {
    rl_evsock_close(s);
    if (s->opened) rl_conn_free(&s->conn);
    s->opened = 0;
}
