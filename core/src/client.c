/* client.c — rl_client: the engine (engine.c) driven over non-blocking
 * sockets on a libev loop of its own, one holder per engine link
 * (evsock.c): each node's command connection and its subscriber
 * connection, driven alike.
 *
 * The engine decides; this file moves bytes and reads the clock. After
 * every call into the engine, service() does what it asks (close, connect)
 * and re-arms one timer for the engine's next deadline. Writes wait for the
 * loop's prepare watcher (and the end of every rl_run / rl_wait / rl_sleep),
 * so everything begun in one loop iteration goes out in one write per node;
 * a watch's SUBSCRIBE goes out at once. A failed acquire is handed back
 * (rl_wait, rl_collect) only once its cleanup is written, even if that
 * means driving the loop while a node with a full socket reads
 * (write_cleanup).
 *
 * Like any driver, it knows the engine through redlock.h's rl_engine_*
 * calls only: where each node is (rl_engine_node_host/port/tls), and what
 * a result may wait for before it is handed back (rl_engine_finished,
 * rl_engine_first_done, rl_engine_cleanup_unwritten, rl_engine_held_until). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "client.h"
#include "evsock.h"

struct rl_client {
    rl_engine *engine;
    int nnodes;
    struct ev_loop *loop;
    rl_evsock links[2 * RL_MAX_NODES]; /* by link: the nodes' command connections, then their subscribers */
    rl_url addrs[RL_MAX_NODES];  /* where each node is, as the engine says (both its links connect there) */
    ev_prepare flusher;      /* before the loop polls: write what was queued */
    ev_timer deadline;       /* the engine's next deadline */
    double armed_at;         /* when the deadline timer fires (0: not armed) */
    ev_timer run_timer;      /* bounds rl_run / rl_sleep */
    int run_expired;
    int node_timeout_ms;     /* bounds the tails served by rl_client_free */
    int connect_timeout_ms;  /* with reconnect_max_ms, bounds the unwritten commands served by rl_client_free */
    int reconnect_max_ms;
    rl_tls *tls;             /* one TLS context for every rediss:// node (NULL: none) */
    void (*unlock)(void *);  /* rl_client_share: around the loop's waits */
    void (*lock)(void *);
    void *lock_arg;
};

static void service(rl_client *c);

static void after_event(void *owner) {
    service(owner);
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

/* Close and connect what the engine asks to, until it asks nothing more
 * (a connect that fails at once answers commands, which may ask for more);
 * writes are left to the flush. Then re-arm the deadline. */
static void service(rl_client *c) {
    unsigned bits;
    int asked = 1;
    while (asked && (bits = rl_engine_wanting(c->engine)) != 0) {
        asked = 0;
        for (int i = 0; i < 2 * c->nnodes; i++) {
            if (!(bits & (1u << i))) continue;
            int w = rl_engine_node_wants(c->engine, i);
            if (w & RL_WANT_CLOSE) rl_evsock_close(&c->links[i]);
            if (w & RL_WANT_CONNECT) rl_evsock_connect(&c->links[i]);
            asked |= w & (RL_WANT_CLOSE | RL_WANT_CONNECT);
        }
    }
    arm_deadline(c);
}

/* Write what every link has queued: one write per node for all the
 * commands begun or re-sent since the last flush. */
static void flush_all(rl_client *c) {
    unsigned bits = rl_engine_wanting(c->engine);
    for (int i = 0; i < 2 * c->nnodes; i++)
        if (bits & (1u << i)) rl_evsock_flush(&c->links[i]);
    service(c);
}

/* Write what the subscriber links have queued (a watch's SUBSCRIBE). */
static void flush_subscribers(rl_client *c) {
    unsigned bits = rl_engine_wanting(c->engine);
    for (int i = c->nnodes; i < 2 * c->nnodes; i++)
        if (bits & (1u << i)) rl_evsock_flush(&c->links[i]);
    service(c);
}

static void on_prepare(EV_P_ ev_prepare *w, int revents) {
    (void)loop;
    (void)revents;
    flush_all(w->data);
}

/* libev runs an overdue timer before I/O that arrived in the same loop
 * iteration. Before the engine judges anyone late, take what the sockets
 * already have: finished connects, handshake steps and replies. */
static void on_deadline(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    rl_client *c = w->data;
    c->armed_at = 0;
    rl_evsock_take_ready(c->links, 2 * c->nnodes);
    rl_engine_advance(c->engine, rl_now_ms());
    service(c);
}

/* ---- the client ---- */

/* Where node i is, from what the engine tells every driver: a TCP host
 * and port (TLS or not), or a unix socket path (port 0). Only the address
 * matters to a socket; AUTH, SELECT and the rest are the engine's. */
static void node_address(const rl_engine *e, int i, rl_url *u) {
    const char *host = rl_engine_node_host(e, i);
    memset(u, 0, sizeof(*u));
    u->port = rl_engine_node_port(e, i);
    u->kind = u->port > 0 ? RL_URL_TCP : RL_URL_UNIX;
    u->tls = rl_engine_node_tls(e, i);
    snprintf(u->kind == RL_URL_TCP ? u->host : u->path, u->kind == RL_URL_TCP ? sizeof(u->host) : sizeof(u->path),
             "%s", host ? host : "");
    snprintf(u->name, sizeof(u->name), "%s", rl_engine_node_name(e, i));
}

static void on_run_timer(EV_P_ ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    ((rl_client *)w->data)->run_expired = 1;
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
    c->loop = loop;
    c->nnodes = nurls;
    ev_timer_init(&c->run_timer, on_run_timer, 0., 0.);
    c->run_timer.data = c;
    ev_timer_init(&c->deadline, on_deadline, 0., 0.);
    c->deadline.data = c;
    ev_prepare_init(&c->flusher, on_prepare);
    c->flusher.data = c;
    ev_prepare_start(c->loop, &c->flusher);
    ev_unref(c->loop); /* the flusher alone does not keep the loop running */

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
    for (int i = 0; i < nurls; i++) rl_evsock_lookup(&c->links[i]);
    double deadline = rl_now_ms() + opts->connect_timeout_ms;
    for (int i = 0; i < nurls; i++) rl_conn_wait_lookup(&c->links[i].conn, deadline, opts->connect_timeout_ms);
    for (int i = 0; i < nurls; i++) rl_engine_node_open(e, i, rl_now_ms());
    service(c);
    return c;
}

static void arm_run_timer(rl_client *c, int ms);

/* Run the loop until done() is 0 or ms have passed. */
static void run_while(rl_client *c, int (*done)(const rl_engine *), int ms) {
    if (done(c->engine) == 0) return;
    arm_run_timer(c, ms);
    while (done(c->engine) > 0 && !c->run_expired) ev_run(c->loop, EVRUN_ONCE);
    ev_timer_stop(c->loop, &c->run_timer);
}

/* Before closing: serve the tails for at most the node timeout, then give
 * nodes with commands not written yet (releases kept for a reconnecting
 * node, a tail queued behind a connection's setup) the time to take them,
 * at most the reconnect backoff's cap plus the connect timeout: a key left
 * behind would stand for its whole ttl. */
static void finish_tails(rl_client *c) {
    run_while(c, rl_engine_tails, c->node_timeout_ms);
    long long bound = (long long)c->reconnect_max_ms + c->connect_timeout_ms;
    run_while(c, rl_engine_unwritten, bound < INT_MAX ? (int)bound : INT_MAX);
    flush_all(c);
}

void rl_client_run_while(rl_client *c, int (*busy)(const rl_engine *), int ms) {
    run_while(c, busy, ms);
}

void rl_client_free(rl_client *c) {
    if (c == NULL) return;
    finish_tails(c);
    for (int i = 0; i < 2 * c->nnodes; i++) rl_evsock_free(&c->links[i]);
    ev_timer_stop(c->loop, &c->run_timer);
    ev_timer_stop(c->loop, &c->deadline);
    ev_ref(c->loop);
    ev_prepare_stop(c->loop, &c->flusher);
    ev_loop_destroy(c->loop);
    rl_engine_free(c->engine);
    rl_tls_free(c->tls);
    free(c);
}

int rl_client_nodes(const rl_client *c) {
    return c->nnodes;
}

const char *rl_client_node_name(const rl_client *c, int i) {
    return rl_engine_node_name(c->engine, i);
}

int rl_client_quorum(const rl_client *c) {
    return rl_engine_quorum(c->engine);
}

const char *rl_client_errstr(const rl_client *c) {
    return rl_engine_errstr(c->engine);
}

/* ---- beginning operations ---- */

/* The clock starts here, before the first byte is sent; the command goes out
 * with the next flush. */
static int begun(rl_client *c, int id) {
    if (id >= 0) service(c);
    return id;
}

int rl_begin_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    return begun(c, rl_engine_begin_acquire(c->engine, resource, len, ttl_ms, rl_now_ms()));
}

int rl_begin_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    return begun(c, rl_engine_begin_acquire_fenced(c->engine, resource, len, ttl_ms, rl_now_ms()));
}

int rl_begin_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    return begun(c, rl_engine_begin_acquire_queued(c->engine, resource, len, ttl_ms, rl_now_ms()));
}

int rl_begin_release(rl_client *c, const char *resource, size_t len, const char *value) {
    return begun(c, rl_engine_begin_release(c->engine, resource, len, value, rl_now_ms()));
}

int rl_begin_release_quiet(rl_client *c, const char *resource, size_t len, const char *value) {
    return begun(c, rl_engine_begin_release_quiet(c->engine, resource, len, value, rl_now_ms()));
}

int rl_begin_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms) {
    return begun(c, rl_engine_begin_extend(c->engine, resource, len, value, ttl_ms, rl_now_ms()));
}

/* ---- driving and collecting ---- */

static void arm_run_timer(rl_client *c, int ms) {
    c->run_expired = 0;
    ev_now_update(c->loop);
    ev_timer_set(&c->run_timer, ms / 1000.0, 0.);
    ev_timer_start(c->loop, &c->run_timer);
}

/* Every way of driving the loop ends with a flush, so commands queued by the
 * last replies (cleanups, re-sends) are on their way while the caller is not
 * driving it. */
int rl_run(rl_client *c, int timeout_ms) {
    int done = rl_engine_done(c->engine);
    if (timeout_ms == 0 || done > 0 || (timeout_ms < 0 && rl_engine_inflight(c->engine) == 0)) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        if (timeout_ms > 0) arm_run_timer(c, timeout_ms);
        else c->run_expired = 0;
        while (rl_engine_done(c->engine) == 0 && !c->run_expired) ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
    flush_all(c);
    return rl_engine_done(c->engine);
}

void rl_sleep(rl_client *c, int ms) {
    if (ms <= 0) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        arm_run_timer(c, ms);
        while (!c->run_expired) ev_run(c->loop, EVRUN_ONCE);
    }
    flush_all(c);
}

/* A failed acquire is handed back only once its cleanup is written: the
 * caller may stop driving the client as soon as it has the result (a
 * program that gives up after a failed batch), and a release left in our
 * output would never reach the node its SET is on. The last flush of the
 * call that decided it writes what the socket takes; a node still working
 * through a large batch takes the rest as it reads. That ends, because the
 * node takes the bytes, or takes none for stall_reset_ms and its connection
 * is reset by the stall watchdog (the release is then kept for the node's
 * next connection), or it is still being set up and what waits behind its
 * setup is taken back at the cleanup's node timeout (neither the SET nor
 * the release went out; the connection goes on with its setup). */
static void write_cleanup(rl_client *c, int id) {
    while (rl_engine_cleanup_unwritten(c->engine, id)) {
        flush_all(c);
        if (!rl_engine_cleanup_unwritten(c->engine, id)) break;
        ev_run(c->loop, EVRUN_ONCE);
    }
}

int rl_collect(rl_client *c, rl_result *out) {
    int id = rl_engine_first_done(c->engine);
    if (id >= 0 && out != NULL) write_cleanup(c, id);
    return rl_engine_collect(c->engine, out);
}

/* A blocking call returns once its operation is done. A command held on a
 * fresh connection until its setup is answered would otherwise wait for the
 * caller's next call to go out (the caller may not make one for a long
 * time): give such setups what is left of their node timeout. A connection
 * older than that (a stalled node) costs nothing. */
static void settle(rl_client *c, int id) {
    double until;
    while ((until = rl_engine_held_until(c->engine, id)) > 0) {
        double left = until - rl_now_ms();
        if (left <= 0) break;
        arm_run_timer(c, (int)left + 1);
        ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
}

int rl_wait(rl_client *c, int id, rl_result *out) {
    int finished;
    while ((finished = rl_engine_finished(c->engine, id)) == 0) ev_run(c->loop, EVRUN_ONCE);
    if (finished < 0) return rl_engine_take(c->engine, id, out); /* RL_ERR, with the reason */
    settle(c, id);
    flush_all(c);
    write_cleanup(c, id);
    return rl_engine_take(c->engine, id, out) == 1 ? RL_OK : RL_ERR;
}

static int finish(rl_client *c, int id, rl_result *out) {
    return id < 0 ? id : rl_wait(c, id, out); /* RL_ERR or RL_ERR_FULL, as begun */
}

int rl_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_acquire(c, resource, len, ttl_ms), out);
}

int rl_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_acquire_fenced(c, resource, len, ttl_ms), out);
}

int rl_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_acquire_queued(c, resource, len, ttl_ms), out);
}

int rl_release(rl_client *c, const char *resource, size_t len, const char *value, rl_result *out) {
    return finish(c, rl_begin_release(c, resource, len, value), out);
}

int rl_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_extend(c, resource, len, value, ttl_ms), out);
}

/* ---- hand-off: waiting for a release ---- */

int rl_watch(rl_client *c, const char *resource, size_t len) {
    int id = rl_engine_watch(c->engine, resource, len, rl_now_ms());
    flush_subscribers(c);
    return id >= 0 ? RL_OK : RL_ERR;
}

void rl_unwatch(rl_client *c, const char *resource, size_t len) {
    rl_engine_unwatch(c->engine, resource, len, rl_now_ms());
    flush_subscribers(c);
}

unsigned rl_heard(const rl_client *c, const char *resource, size_t len) {
    return rl_engine_heard(c->engine, resource, len);
}

int rl_heard_listeners(const rl_client *c, const char *resource, size_t len) {
    return rl_engine_heard_listeners(c->engine, resource, len);
}

int rl_sleep_until(rl_client *c, const char *resource, size_t len, unsigned heard, int ms) {
    if (ms > 0 && rl_heard(c, resource, len) == heard) {
        arm_run_timer(c, ms);
        while (!c->run_expired && rl_heard(c, resource, len) == heard) ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    } else {
        ev_run(c->loop, EVRUN_NOWAIT);
    }
    flush_all(c);
    return rl_heard(c, resource, len) != heard;
}

int rl_client_listening(const rl_client *c) {
    return rl_engine_listening(c->engine);
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
    ev_set_userdata(c->loop, c);
    ev_set_loop_release_cb(c->loop, loop_releases, loop_acquires);
}
