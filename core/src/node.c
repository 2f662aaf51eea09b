/* node.c — one node's connection lifecycle (see node.h). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/adapters/libev.h>

#include "node.h"

static void connect_now(rl_node *n);
static void on_watchdog(EV_P_ ev_timer *w, int revents);

/* libev runs an overdue timer before the I/O that arrived in the same loop
 * iteration (pending watchers are invoked last in, first out). A timer that
 * judges a connection looks at the socket itself first. */
static int socket_ready(const redisAsyncContext *ac, short events) {
    struct pollfd p = {.fd = ac->c.fd, .events = events};
    return poll(&p, 1, 0) == 1 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL)) && (p.revents & events);
}

static void set_err(rl_node *n, const char *prefix, const char *text) {
    snprintf(n->errstr, sizeof(n->errstr), "%s%s", prefix, text && *text ? text : "unknown error");
}

static void schedule_reconnect(rl_node *n) {
    n->ac = NULL;
    n->link = RL_LINK_DOWN;
    if (n->closing) return;
    ev_timer_stop(n->loop, &n->connect_timer);
    n->retry_at_ms = rl_now_ms() + n->backoff_ms;
    ev_timer_set(&n->retry_timer, n->backoff_ms / 1000.0, 0.);
    ev_now_update(n->loop);
    ev_timer_start(n->loop, &n->retry_timer);
    n->backoff_ms *= 2;
    if (n->backoff_ms > n->opts->reconnect_max_ms) n->backoff_ms = n->opts->reconnect_max_ms;
}

static rl_ticket ring_pop(rl_node *n) {
    rl_ticket t = {-1, 0, 0, 0};
    if (n->ring_count == 0) return t;
    t = n->ring[n->ring_head];
    n->ring_head = (n->ring_head + 1) % n->ring_cap;
    n->ring_count--;
    return t;
}

static int ring_push(rl_node *n, rl_ticket t) {
    if (n->ring_count == n->ring_cap) {
        unsigned cap = n->ring_cap ? n->ring_cap * 2 : 64;
        rl_ticket *ring = malloc(cap * sizeof(*ring));
        if (!ring) return -1;
        for (unsigned i = 0; i < n->ring_count; i++) ring[i] = n->ring[(n->ring_head + i) % n->ring_cap];
        free(n->ring);
        n->ring = ring;
        n->ring_cap = cap;
        n->ring_head = 0;
    }
    n->ring[(n->ring_head + n->ring_count) % n->ring_cap] = t;
    n->ring_count++;
    return 0;
}

/* Undo the last ring_push (the command it was for was not queued). */
static void ring_unpush(rl_node *n) {
    n->ring_count--;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata) {
    rl_node *n = privdata;
    redisReply *reply = r;
    rl_ticket t = ring_pop(n);
    const char *errstr = NULL;
    if (reply == NULL) {
        errstr = ac->err && ac->errstr[0] ? ac->errstr : "connection closed";
        if (n->sticky_err) errstr = n->errstr;
    } else if (n->sticky_err && reply->type == REDIS_REPLY_ERROR) {
        /* NOAUTH after a refused AUTH: report the cause, not the symptom. */
        reply = NULL;
        errstr = n->errstr;
    }
    n->on_reply(n->owner, n->index, t, reply, errstr);
}

/* AUTH or SELECT refused: remember why, and drop the connection once its
 * queued commands have been answered (they fail with the reason). */
static void setup_refused(redisAsyncContext *ac, rl_node *n, const char *what, redisReply *reply) {
    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) return;
    if (!n->sticky_err) {
        snprintf(n->errstr, sizeof(n->errstr), "%s refused: %s", what, reply->str);
        n->sticky_err = 1;
    }
    redisAsyncDisconnect(ac);
}

static void on_auth_reply(redisAsyncContext *ac, void *r, void *privdata) {
    setup_refused(ac, privdata, "AUTH", r);
}

static void on_select_reply(redisAsyncContext *ac, void *r, void *privdata) {
    setup_refused(ac, privdata, "SELECT", r);
}

static void on_connect(const redisAsyncContext *ac, int status) {
    rl_node *n = ac->data;
    ev_timer_stop(n->loop, &n->connect_timer);
    if (status != REDIS_OK) {
        set_err(n, "connect failed: ", ac->errstr);
        schedule_reconnect(n); /* hiredis frees ac after this callback */
        return;
    }
    n->link = RL_LINK_UP;
    n->backoff_ms = n->opts->reconnect_min_ms;
    if (!n->sticky_err) n->errstr[0] = '\0';
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    rl_node *n = ac->data;
    if (!n->sticky_err) {
        if (status != REDIS_OK) set_err(n, "connection lost: ", ac->errstr);
        else snprintf(n->errstr, sizeof(n->errstr), "connection closed");
    }
    schedule_reconnect(n);
}

static void on_connect_timeout(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    redisAsyncContext *ac = n->ac;
    if (ac && socket_ready(ac, POLLOUT)) {
        redisAsyncHandleWrite(ac); /* connected while nobody drove the loop */
        return;
    }
    snprintf(n->errstr, sizeof(n->errstr), "connect timed out after %d ms", n->opts->connect_timeout_ms);
    n->sticky_err = 1;
    schedule_reconnect(n);
    if (ac) {
        ac->onDisconnect = NULL; /* we already know; do not schedule twice */
        redisAsyncFree(ac);
    }
}

static void on_retry_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    connect_now(w->data);
}

static int send_setup(rl_node *n) {
    const char *argv[3];
    size_t argvlen[3];
    int argc = 0;
    if (n->url.password[0]) {
        argv[argc] = "AUTH";
        argvlen[argc++] = 4;
        if (n->url.user[0]) {
            argv[argc] = n->url.user;
            argvlen[argc] = strlen(n->url.user);
            argc++;
        }
        argv[argc] = n->url.password;
        argvlen[argc] = strlen(n->url.password);
        argc++;
        if (redisAsyncCommandArgv(n->ac, on_auth_reply, n, argc, argv, argvlen) != REDIS_OK) return -1;
    }
    if (n->url.db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", n->url.db);
        argv[0] = "SELECT";
        argvlen[0] = 6;
        argv[1] = db;
        argvlen[1] = strlen(db);
        if (redisAsyncCommandArgv(n->ac, on_select_reply, n, 2, argv, argvlen) != REDIS_OK) return -1;
    }
    return 0;
}

static void connect_now(rl_node *n) {
    redisAsyncContext *ac = n->url.kind == RL_URL_UNIX ? redisAsyncConnectUnix(n->url.path)
                                                       : redisAsyncConnect(n->url.host, n->url.port);
    n->sticky_err = 0;
    if (ac == NULL) {
        set_err(n, "connect failed: ", "out of memory");
        schedule_reconnect(n);
        return;
    }
    if (ac->err) {
        set_err(n, "connect failed: ", ac->errstr);
        redisAsyncFree(ac);
        schedule_reconnect(n);
        return;
    }
    ac->data = n;
    redisLibevAttach(n->loop, ac);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    n->ac = ac;
    n->link = RL_LINK_CONNECTING;
    snprintf(n->errstr, sizeof(n->errstr), "connecting");
    if (send_setup(n) != 0) set_err(n, "setup failed: ", ac->errstr);
    ev_timer_set(&n->connect_timer, n->opts->connect_timeout_ms / 1000.0, 0.);
    ev_now_update(n->loop);
    ev_timer_start(n->loop, &n->connect_timer);
}

void rl_node_init(rl_node *n, const rl_url *url, int index, struct ev_loop *loop,
                  const rl_options *opts, rl_reply_fn on_reply_fn, void *owner) {
    memset(n, 0, sizeof(*n));
    n->url = *url;
    n->index = index;
    n->loop = loop;
    n->opts = opts;
    n->on_reply = on_reply_fn;
    n->owner = owner;
    n->backoff_ms = opts->reconnect_min_ms;
    ev_timer_init(&n->connect_timer, on_connect_timeout, 0., 0.);
    ev_timer_init(&n->retry_timer, on_retry_timer, 0., 0.);
    double period = opts->stall_reset_ms / 2000.0;
    ev_timer_init(&n->watchdog, on_watchdog, period, period);
    n->connect_timer.data = n;
    n->retry_timer.data = n;
    n->watchdog.data = n;
    snprintf(n->errstr, sizeof(n->errstr), "not connected");
}

void rl_node_start(rl_node *n) {
    ev_timer_start(n->loop, &n->watchdog);
    connect_now(n);
}

int rl_node_send(rl_node *n, const char *cmd, size_t len, rl_ticket ticket) {
    if (n->ac == NULL && !n->closing && rl_now_ms() >= n->retry_at_ms) {
        /* The backoff is over but nobody drove the loop to fire the timer:
         * reconnect now and queue the command behind the connect. */
        ev_timer_stop(n->loop, &n->retry_timer);
        connect_now(n);
    }
    if (n->ac == NULL) return -1;
    ticket.sent_ms = rl_now_ms();
    if (ring_push(n, ticket) != 0) {
        snprintf(n->errstr, sizeof(n->errstr), "out of memory");
        return -1;
    }
    if (redisAsyncFormattedCommand(n->ac, on_reply, n, cmd, len) != REDIS_OK) {
        ring_unpush(n);
        if (!n->sticky_err) snprintf(n->errstr, sizeof(n->errstr), "connection closing");
        return -1;
    }
    return 0;
}

/* Commands unanswered for stall_reset_ms: a reply was lost (or the node hangs),
 * and the reply stream cannot resynchronise. Drop the connection (its
 * commands are answered with errors through on_reply) and reconnect. */
static void on_watchdog(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_node *n = w->data;
    if (n->ac == NULL || n->ring_count == 0) return;
    if (rl_now_ms() - n->ring[n->ring_head].sent_ms < n->opts->stall_reset_ms) return;
    if (socket_ready(n->ac, POLLIN)) return; /* replies are there, just not read yet */
    char why[64];
    snprintf(why, sizeof(why), "connection reset: no reply for %d ms", n->opts->stall_reset_ms);
    rl_node_reset(n, why);
}

void rl_node_reset(rl_node *n, const char *why) {
    redisAsyncContext *ac = n->ac;
    if (ac == NULL) return;
    snprintf(n->errstr, sizeof(n->errstr), "%s", why);
    n->sticky_err = 1;
    schedule_reconnect(n);
    ac->onDisconnect = NULL;
    redisAsyncFree(ac); /* deferred by hiredis when called from one of its callbacks */
}

void rl_node_close(rl_node *n) {
    n->closing = 1;
    ev_timer_stop(n->loop, &n->connect_timer);
    ev_timer_stop(n->loop, &n->retry_timer);
    ev_timer_stop(n->loop, &n->watchdog);
    if (n->ac) {
        redisAsyncContext *ac = n->ac;
        n->ac = NULL;
        ac->onDisconnect = NULL;
        redisAsyncFree(ac);
    }
    free(n->ring);
    n->ring = NULL;
    n->ring_cap = n->ring_count = n->ring_head = 0;
}
