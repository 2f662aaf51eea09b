/* client.c — rl_client: the engine (engine.c) driven over non-blocking
 * sockets on a libev loop of its own, one holder per engine link
 * (evsock.c): each node's command connection and its subscriber
 * connection, driven alike. This file: the loop, its links and the
 * client's life; the calls of the API are client_calls.c's.
 *
 * The engine decides; this file moves bytes and reads the clock. After
 * every call into the engine, service() does what it asks (close, connect)
 * and re-arms one timer for the engine's next deadline. Writes wait for the
 * loop's prepare watcher (and the end of every rl_run / rl_wait / rl_sleep),
 * so everything begun in one loop iteration goes out in one write per node;
 * a watch's SUBSCRIBE goes out at once.
 *
 * Like any driver, it knows the engine through redlock.h's rl_engine_*
 * calls only: where each node is (rl_engine_node_host/port/tls), and what
 * a result may wait for before it is handed back (client_calls.c). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "client_impl.h"
#include "value.h"

static void after_event(void *owner) {
    rl_client_service(owner);
}

/* ---- what the engine asks for ---- */

/* Arm the timer for the engine's next deadline, unless it fires by then. */
static void arm_deadline(rl_client *c) {
    double at = rl_engine_deadline(c->engine);
    if (at < 0 || (c->armed_at > 0 && c->armed_at <= at)) return;
    double left = at - rl_now_ms();
    ev_timer_stop(c->loop, &c->deadline);
    ev_now_update(c->loop);
    ev_timer_set(&c->deadline, left > 0 ? left / 1000.0 : 0., 0.);
    ev_timer_start(c->loop, &c->deadline);
    c->armed_at = at;
}

static void node_address(const rl_engine *e, int i, rl_url *u);

/* Place the links the engine has made since the last look (a cluster
 * node's shards, as their map comes in): where each connects. A link with
 * no room for its address is left unplaced, and fails its connects. */
static void place_links(rl_client *c) {
    int n = rl_engine_links(c->engine);
    for (; c->nlinks < n && c->nlinks < RL_MAX_LINKS; c->nlinks++) {
        int k = c->nlinks, shard = (k - 2 * c->nnodes) / 2;
        if (k % 2 == 0 && (c->shard_addrs[shard] = malloc(sizeof(rl_url))) == NULL) break;
        rl_url *addr = c->shard_addrs[shard];
        if (k % 2 == 0) node_address(c->engine, k, addr);
        rl_evsock_init(&c->links[k], c->loop, c->engine, k, addr, rl_engine_node_tls(c->engine, k) ? c->tls : NULL,
                       after_event, c);
    }
}

/* Link k, placed (NULL if it cannot be). */
static rl_evsock *link_at(rl_client *c, int k) {
    if (k >= c->nlinks) place_links(c);
    return k < c->nlinks ? &c->links[k] : NULL;
}

/* Before link k connects: a shard the engine reused for another master
 * (redlock.h, "Links") connects where the engine says now, so when its
 * address changed both its links are placed again there (their sockets
 * closed, a name lookup under way dropped: the engine asked to close
 * them). */
static void follow_address(rl_client *c, int k) {
    if (k < 2 * c->nnodes || k >= c->nlinks) return;
    int first = k - (k - 2 * c->nnodes) % 2, shard = (first - 2 * c->nnodes) / 2;
    rl_url *addr = c->shard_addrs[shard], now;
    node_address(c->engine, first, &now);
    if (memcmp(addr, &now, sizeof(now)) == 0) return;
    for (int j = first; j < first + 2 && j < c->nlinks; j++) rl_evsock_free(&c->links[j]);
    *addr = now;
    for (int j = first; j < first + 2 && j < c->nlinks; j++)
        rl_evsock_init(&c->links[j], c->loop, c->engine, j, addr, rl_engine_node_tls(c->engine, j) ? c->tls : NULL,
                       after_event, c);
}

/* A subscriber link: a node's (N .. 2N-1) or a shard's (2N + 2k + 1). */
static int subscriber_link(const rl_client *c, int k) {
    return k < 2 * c->nnodes ? k >= c->nnodes : (k - 2 * c->nnodes) % 2 == 1;
}

/* Close and connect what the engine asks to, until it asks nothing more
 * (a connect that fails at once answers commands, which may ask for more);
 * writes are left to the flush. Then re-arm the deadline. */
void rl_client_service(rl_client *c) {
    int asked = 1;
    while (asked) {
        asked = 0;
        for (int k = rl_engine_next_wanting(c->engine, -1); k >= 0; k = rl_engine_next_wanting(c->engine, k)) {
            int w = rl_engine_node_wants(c->engine, k);
            rl_evsock *s = link_at(c, k);
            if (s == NULL) {
                if (w & RL_WANT_CONNECT) rl_engine_node_down(c->engine, k, "out of memory", rl_now_ms());
                continue;
            }
            if (w & RL_WANT_CLOSE) rl_evsock_close(s);
            if (w & RL_WANT_CONNECT) {
                follow_address(c, k);
                rl_evsock_connect(s);
            }
            asked |= w & (RL_WANT_CLOSE | RL_WANT_CONNECT);
        }
    }
    arm_deadline(c);
}

/* Write what the links (subscribers: only theirs) have queued. */
static void flush_links(rl_client *c, int subscribers) {
    for (int k = rl_engine_next_wanting(c->engine, -1); k >= 0; k = rl_engine_next_wanting(c->engine, k)) {
        rl_evsock *s = link_at(c, k);
        if (s && (!subscribers || subscriber_link(c, k))) rl_evsock_flush(s);
    }
    rl_client_service(c);
}

/* Write what every link has queued: one write per node for all the
 * commands begun or re-sent since the last flush. */
void rl_client_flush(rl_client *c) {
    flush_links(c, 0);
}

/* Write what the subscriber links have queued (a watch's SUBSCRIBE). */
void rl_client_flush_subscribers(rl_client *c) {
    flush_links(c, 1);
}

/* Replies read after the loop had not polled for this long, by a poll that
 * came back at once, may have waited in their sockets since anywhere in
 * that gap: not timed (rl_engine_untimed_reads). Polls inside one call
 * follow each other within microseconds; a caller away between its calls
 * leaves a gap. */
#define READ_GAP_MS 1.0
#define AT_ONCE_MS 0.05

static void on_prepare(EV_P_ ev_prepare *w, int revents) {
    (void)loop;
    (void)revents;
    rl_client *c = w->data;
    rl_client_flush(c);
    rl_engine_untimed_reads(c->engine, 0);
    c->poll_began = rl_now_ms();
}

/* After a poll, before anything it found is read (the highest priority). */
static void on_check(EV_P_ ev_check *w, int revents) {
    (void)loop;
    (void)revents;
    rl_client *c = w->data;
    double now = rl_now_ms();
    int after_gap = c->poll_ended > 0 && c->poll_began - c->poll_ended > READ_GAP_MS;
    rl_engine_untimed_reads(c->engine, after_gap && now - c->poll_began < AT_ONCE_MS);
    c->poll_ended = now;
}

/* libev runs an overdue timer before I/O that arrived in the same loop
 * iteration. Before the engine judges anyone late, take what the sockets
 * already have: finished connects, handshake steps and replies. */
static void advance(rl_client *c, double now_ms) {
    c->armed_at = 0;
    rl_evsock_take_ready(c->links, c->nlinks);
    rl_engine_advance(c->engine, now_ms);
    rl_client_service(c);
}

static void on_deadline(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    advance(w->data, rl_now_ms());
}

void rl_client_take_after_gap(rl_client *c, double now_ms) {
    if (c->poll_ended > 0 && now_ms - c->poll_ended <= READ_GAP_MS) return; /* (0: never polled) */
    rl_engine_untimed_reads(c->engine, 1); /* (they may have waited since the last poll) */
    /* twice: a read that finds replies stops short of the EOF behind them */
    rl_evsock_take_after_gap(c->links, c->nlinks);
    rl_evsock_take_after_gap(c->links, c->nlinks);
    rl_engine_untimed_reads(c->engine, 0);
    c->poll_ended = now_ms;
}

void rl_client_catch_up(rl_client *c, double now_ms) {
    double due = rl_engine_deadline(c->engine);
    if (due < 0 || due > now_ms) return;
    /* (outside the loop: what it reads may have waited since the last poll) */
    rl_engine_untimed_reads(c->engine, c->poll_ended > 0 && now_ms - c->poll_ended > READ_GAP_MS);
    advance(c, now_ms);
    rl_engine_untimed_reads(c->engine, 0);
}

/* ---- the client ---- */

/* Where node i is, from what the engine tells every driver: a TCP host
 * and port (TLS or not, and the name its certificate must be for), or a
 * unix socket path (port 0). Only the address
 * matters to a socket; AUTH, SELECT and the rest are the engine's. */
static void node_address(const rl_engine *e, int i, rl_url *u) {
    const char *host = rl_engine_node_host(e, i);
    memset(u, 0, sizeof(*u));
    u->port = rl_engine_node_port(e, i);
    u->kind = u->port > 0 ? RL_URL_TCP : RL_URL_UNIX;
    u->tls = rl_engine_node_tls(e, i);
    snprintf(u->kind == RL_URL_TCP ? u->host : u->path, u->kind == RL_URL_TCP ? sizeof(u->host) : sizeof(u->path),
             "%s", host ? host : "");
    if (u->kind == RL_URL_TCP) snprintf(u->tls_name, sizeof(u->tls_name), "%s", rl_engine_node_tls_name(e, i));
    snprintf(u->name, sizeof(u->name), "%s", rl_engine_node_name(e, i));
}

static void on_run_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    ((rl_client *)w->data)->run_expired = 1;
}

static void on_run_fd(EV_P_ ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    rl_client *c = w->data;
    uint64_t fired;
    if (read(c->run_fd, &fired, sizeof fired) == (ssize_t)sizeof fired) c->run_reached = 1;
}

rl_client *rl_client_new(const char *const *urls, int nurls, const rl_options *opts, char *err,
                         size_t errlen) {
    rl_engine *e = rl_engine_new(urls, nurls, opts, err, errlen);
    if (e == NULL) return NULL;
    rl_options defaults;
    if (opts == NULL) rl_options_init(&defaults), opts = &defaults;
    /* One TLS context for every rediss:// node, made only when there is one
     * (loading the system's CAs is not free) or when TLS files are named:
     * a file that cannot be used is an error here, whatever the URLs say. */
    const rl_tls_options *to = &opts->tls;
    int want_tls = to->cafile || to->capath || to->certfile || to->keyfile;
    for (int i = 0; i < nurls && !want_tls; i++) want_tls = rl_engine_node_tls(e, i);
    rl_tls *tls = NULL;
    if (want_tls) {
        char why[RL_ERR_LEN];
        tls = rl_tls_new(to, why, sizeof(why));
        if (tls == NULL) {
            if (err) snprintf(err, errlen, "%s", why);
            rl_engine_free(e);
            return NULL;
        }
    }
    rl_client *c = calloc(1, sizeof(*c));
    struct ev_loop *loop = c ? ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK) : NULL;
    if (loop == NULL) {
        if (err) snprintf(err, errlen, "out of memory (or no event loop backend)");
        free(c);
        rl_tls_free(tls);
        rl_engine_free(e);
        return NULL;
    }
    c->tls = tls;
    c->engine = e;
    c->generation = rl_fork_generation();
    c->loop = loop;
    c->nnodes = nurls;
    ev_timer_init(&c->run_timer, on_run_timer, 0., 0.);
    c->run_timer.data = c;
    c->run_fd = -1;
    ev_timer_init(&c->deadline, on_deadline, 0., 0.);
    c->deadline.data = c;
    ev_prepare_init(&c->flusher, on_prepare);
    c->flusher.data = c;
    ev_prepare_start(c->loop, &c->flusher);
    ev_unref(c->loop); /* the flusher alone does not keep the loop running */
    ev_check_init(&c->gauge, on_check);
    c->gauge.data = c;
    ev_set_priority(&c->gauge, EV_MAXPRI);
    ev_check_start(c->loop, &c->gauge);
    ev_unref(c->loop); /* nor does the gauge */

    /* Every name is looked up at once and waited for together, so N slow
     * names cost one connect_timeout, not N. Rounds never wait for a lookup. */
    c->node_timeout_ms = opts->node_timeout_ms;
    c->connect_timeout_ms = opts->connect_timeout_ms;
    c->reconnect_max_ms = opts->reconnect_max_ms;
    /* a subscriber link looks its name up when first asked to connect */
    for (int i = 0; i < nurls; i++) node_address(e, i, &c->addrs[i]);
    for (int i = 0; i < 2 * nurls; i++)
        rl_evsock_init(&c->links[i], c->loop, e, i, &c->addrs[i % nurls],
                       rl_engine_node_tls(e, i) ? tls : NULL, after_event, c);
    c->nlinks = 2 * nurls;
    place_links(c); /* a cluster node's other seeds */
    for (int i = 0; i < nurls; i++) rl_evsock_lookup(&c->links[i]);
    double deadline = rl_now_ms() + opts->connect_timeout_ms;
    for (int i = 0; i < nurls; i++) rl_conn_wait_lookup(&c->links[i].conn, deadline, opts->connect_timeout_ms);
    for (int i = 0; i < nurls; i++) rl_engine_node_open(e, i, rl_now_ms());
    rl_client_service(c);
    return c;
}

void rl_client_arm_run_timer(rl_client *c, int ms) {
    c->run_expired = 0;
    ev_now_update(c->loop);
    ev_timer_set(&c->run_timer, ms / 1000.0, 0.);
    ev_timer_start(c->loop, &c->run_timer);
}

int rl_client_arm_run_at(rl_client *c, double deadline_ms) {
    if (c->run_fd < 0) {
        c->run_fd = timerfd_create(CLOCK_BOOTTIME, TFD_NONBLOCK | TFD_CLOEXEC);
        if (c->run_fd < 0) return -1;
        ev_io_init(&c->run_fd_watcher, on_run_fd, c->run_fd, EV_READ);
        c->run_fd_watcher.data = c;
        ev_io_start(c->loop, &c->run_fd_watcher);
        ev_unref(c->loop); /* it alone does not keep the loop running */
    }
    /* rl_now_ms is CLOCK_BOOTTIME too. A deadline at or before 0 (or NaN)
     * would disarm: 1 ns fires at once. Past about 285 years of uptime
     * (HUGE_VAL: no limit) the timer is set there, within long long. */
    double at = deadline_ms > 1e-6 ? deadline_ms : 1e-6;
    if (at > 9e12) at = 9e12;
    /* an event loop asks for the same deadline again and again (each
     * result wakes it before its next hold ends): still set, not reset */
    if (at == c->run_fd_at && !c->run_reached) return 0;
    long long ns = (long long)(at * 1e6);
    struct itimerspec when = {{0, 0}, {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)}};
    c->run_reached = 0;
    if (timerfd_settime(c->run_fd, TFD_TIMER_ABSTIME, &when, NULL) != 0) {
        c->run_fd_at = 0;
        return -1;
    }
    c->run_fd_at = at;
    return 0;
}

/* Run the loop until done() is 0 or ms have passed. */
static void run_while(rl_client *c, int (*done)(const rl_engine *), int ms) {
    if (done(c->engine) == 0) return;
    rl_client_arm_run_timer(c, ms);
    while (done(c->engine) > 0 && !c->run_expired) ev_run(c->loop, EVRUN_ONCE);
    ev_timer_stop(c->loop, &c->run_timer);
}

/* ms, or what is left until deadline_ms if that is less (never below 0). */
static int until_deadline(int ms, double deadline_ms) {
    double left = deadline_ms - rl_now_ms();
    if (left < 0) left = 0;
    return left < ms ? (int)left : ms;
}

/* Before closing, by deadline_ms at the latest: abandon the acquires not
 * collected (rl_engine_abandon: what was not written is not sent, what
 * went out gets its release, a tail), then serve the tails for at
 * most the node timeout, then give nodes with commands not written yet
 * (releases kept for a reconnecting node, a tail queued behind a
 * connection's setup) the time to take them, and nodes still answering
 * what they took (a large batch) the time to answer it, each at most the
 * reconnect backoff's cap plus the connect timeout: a node that finds our
 * socket closed while it answers drops what it has not read, and a key
 * left behind would stand for its whole ttl. A node that stops answering
 * meanwhile becomes suspect, and is not waited for; nor is one sending a
 * reply that does not end (rl_engine_unanswered). */
static void finish_tails(rl_client *c, double deadline_ms) {
    rl_engine_abandon(c->engine, rl_now_ms());
    run_while(c, rl_engine_tails, until_deadline(c->node_timeout_ms, deadline_ms));
    long long bound = (long long)c->reconnect_max_ms + c->connect_timeout_ms;
    int ms = bound < INT_MAX ? (int)bound : INT_MAX;
    run_while(c, rl_engine_unwritten, until_deadline(ms, deadline_ms));
    run_while(c, rl_engine_unanswered, until_deadline(ms, deadline_ms));
    rl_client_flush(c);
}

void rl_client_run_while(rl_client *c, int (*busy)(const rl_engine *), int ms) {
    run_while(c, busy, ms);
}

void rl_client_free(rl_client *c) {
    rl_client_free_by(c, HUGE_VAL);
}

/* What rl_client_close does: the tails served (by deadline_ms), then every
 * socket, timer and descriptor let go, and the loop; the engine (what the
 * reading calls read) and the memory stay for rl_client_free. */
static void close_connections(rl_client *c, double deadline_ms) {
    /* in a forked child the sockets are the parent's too: nothing is read
     * or written (no tails, no TLS close_notify), they are only closed here */
    int forked = c->generation != rl_fork_generation();
    if (!forked) finish_tails(c, deadline_ms);
    for (int i = 0; i < c->nlinks; i++) {
        if (forked) rl_evsock_disown(&c->links[i]);
        else rl_evsock_free(&c->links[i]);
        rl_engine_node_detach(c->engine, i, rl_now_ms()); /* its gauges: not up, not listening */
    }
    for (int k = 0; k < RL_MAX_SHARDS; k++) {
        free(c->shard_addrs[k]);
        c->shard_addrs[k] = NULL;
    }
    ev_timer_stop(c->loop, &c->run_timer);
    ev_timer_stop(c->loop, &c->deadline);
    if (c->run_fd >= 0) {
        ev_ref(c->loop);
        ev_io_stop(c->loop, &c->run_fd_watcher);
        close(c->run_fd);
        c->run_fd = -1;
    }
    ev_ref(c->loop);
    ev_prepare_stop(c->loop, &c->flusher);
    ev_ref(c->loop);
    ev_check_stop(c->loop, &c->gauge);
    ev_loop_destroy(c->loop); /* its epoll descriptor too, not at rl_client_free */
    c->loop = NULL;
    c->closed = 1;
}

void rl_client_close(rl_client *c) {
    if (c != NULL && !c->closed) close_connections(c, HUGE_VAL);
}

void rl_client_free_by(rl_client *c, double deadline_ms) {
    if (c == NULL) return;
    if (!c->closed) close_connections(c, deadline_ms);
    rl_engine_free(c->engine);
    rl_tls_free(c->tls);
    free(c);
}

int rl_client_nodes(const rl_client *c) {
    return c->nnodes;
}

const char *rl_client_node_name(const rl_client *c, int i) {
    return i >= 0 && i < c->nnodes ? rl_engine_node_name(c->engine, i) : NULL;
}

int rl_client_quorum(const rl_client *c) {
    return rl_engine_quorum(c->engine);
}

void rl_client_stats(const rl_client *c, rl_stats *out) {
    rl_engine_stats(c->engine, out);
}

const char *rl_client_errstr(const rl_client *c) {
    return rl_engine_errstr(c->engine);
}

/* ---- the keeper's share of the engine (client.h) ---- */

rl_engine *rl_client_engine(rl_client *c) {
    return c->engine;
}

static void loop_releases(struct ev_loop *loop) EV_NOEXCEPT {
    rl_client *c = ev_userdata(loop);
    c->unlock(c->lock_arg);
}

static void loop_acquires(struct ev_loop *loop) EV_NOEXCEPT {
    rl_client *c = ev_userdata(loop);
    c->lock(c->lock_arg);
}

void rl_client_share(rl_client *c, void (*unlock)(void *), void (*lock)(void *), void *arg) {
    c->unlock = unlock;
    c->lock = lock;
    c->lock_arg = arg;
    if (c->closed) return; /* no loop left to run */
    ev_set_userdata(c->loop, c);
    ev_set_loop_release_cb(c->loop, loop_releases, loop_acquires);
}
