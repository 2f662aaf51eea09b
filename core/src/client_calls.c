/* client_calls.c — the calls of rl_client (redlock.h): beginning
 * operations, driving the loop, handing results back, hand-off.
 *
 * Results are handed back with the guarantees redlock.h's driver contract
 * lets any driver give, by its public calls: a failed acquire is handed
 * back (rl_wait, rl_collect) only once its cleanup is written
 * (rl_engine_cleanup_unwritten), even if that means driving the loop while
 * a node with a full socket reads (write_cleanup); a blocking call lets a
 * command held behind a fresh connection's setup go out first
 * (rl_engine_held_until, settle). */
#include <limits.h>
#include <time.h>

#include "client_impl.h"
#include "engine.h"
#include "value.h"

/* A client made before fork() shares its sockets (and TLS sessions) with
 * the parent: a child reading them would take the parent's replies for its
 * own answers. A closed client (rl_client_close) has none. In either, every
 * call that would use them is refused (RL_ERR, with the reason in
 * rl_client_errstr), or does nothing. */
static int unusable(rl_client *c) {
    if (c->closed) {
        rl_engine_fail(c->engine, "this client was closed");
        return 1;
    }
    if (c->generation == rl_fork_generation()) return 0;
    rl_engine_fail(c->engine, "this client was made before fork(): make a new one in the child");
    return 1;
}

/* ms of plain sleep (a forked child's rl_sleep: no loop to run). */
static void nap(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0) continue;
}

/* ---- beginning operations ---- */

/* The clock starts here, before the first byte is sent; the command goes out
 * with the next flush. */
static int begun(rl_client *c, int id) {
    if (id >= 0) rl_client_service(c);
    return id;
}

/* The time an operation begins at, after what was due meanwhile (a round
 * decided at once runs no loop: the probes of nodes that stopped answering
 * would wait) and a look at the sockets of such nodes
 * (rl_engine_suspects_due): what they sent since is heard first, so a node
 * answering again votes in this round. */
static double now_hearing_suspects(rl_client *c) {
    double now = rl_now_ms();
    rl_client_take_after_gap(c, now);
    rl_client_catch_up(c, now);
    unsigned due = rl_engine_suspects_due(c->engine, now);
    if (due) rl_evsock_take_ready_of(c->links, c->nnodes, due);
    return now;
}

int rl_begin_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_acquire(c->engine, resource, len, ttl_ms, now_hearing_suspects(c)));
}

int rl_begin_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_acquire_fenced(c->engine, resource, len, ttl_ms, now_hearing_suspects(c)));
}

int rl_begin_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_acquire_shared(c->engine, resource, len, ttl_ms, now_hearing_suspects(c)));
}

int rl_begin_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_acquire_queued(c->engine, resource, len, ttl_ms, now_hearing_suspects(c)));
}

int rl_begin_release(rl_client *c, const char *resource, size_t len, const char *value) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_release(c->engine, resource, len, value, now_hearing_suspects(c)));
}

int rl_begin_release_quiet(rl_client *c, const char *resource, size_t len, const char *value) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_release_quiet(c->engine, resource, len, value, now_hearing_suspects(c)));
}

int rl_begin_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    return begun(c, rl_engine_begin_extend(c->engine, resource, len, value, ttl_ms, now_hearing_suspects(c)));
}

int rl_begin_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket) {
    if (unusable(c)) return RL_ERR;
    double now = now_hearing_suspects(c);
    return begun(c, rl_engine_begin_acquire_slot(c->engine, resource, len, limit, ttl_ms, ticket, now));
}

int rl_begin_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value,
                     int ttl_ms) {
    if (unusable(c)) return RL_ERR;
    double now = now_hearing_suspects(c);
    return begun(c, rl_engine_begin_on_slot(c->engine, kind, resource, len, slot, value, ttl_ms, now));
}

/* ---- driving and collecting ---- */

/* Every way of driving the loop ends with a flush, so commands queued by the
 * last replies (cleanups, re-sends) are on their way while the caller is not
 * driving it. */
int rl_run(rl_client *c, int timeout_ms) {
    if (unusable(c)) return RL_ERR;
    int done = rl_engine_done(c->engine);
    if (timeout_ms == 0 || done > 0 || (timeout_ms < 0 && rl_engine_inflight(c->engine) == 0)) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        if (timeout_ms > 0) rl_client_arm_run_timer(c, timeout_ms);
        else c->run_expired = 0;
        while (rl_engine_done(c->engine) == 0 && !c->run_expired) ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
    rl_client_flush(c);
    return rl_engine_done(c->engine);
}

int rl_run_until(rl_client *c, double deadline_ms) {
    if (unusable(c)) return RL_ERR;
    unsigned heard = rl_engine_heard(c->engine, NULL, 0);
    double left = deadline_ms - rl_now_ms();
    if (rl_engine_done(c->engine) > 0 || !(left > 0)) { /* NaN too */
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        /* the timerfd, or (none to be had) the millisecond timer */
        int precise = rl_client_arm_run_at(c, deadline_ms) == 0;
        if (!precise) rl_client_arm_run_timer(c, left < INT_MAX - 1 ? (int)left + 1 : INT_MAX);
        while (rl_engine_done(c->engine) == 0 && !(precise ? c->run_reached : c->run_expired) &&
               rl_engine_heard(c->engine, NULL, 0) == heard)
            ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
    rl_client_flush(c);
    return rl_engine_done(c->engine);
}

void rl_sleep(rl_client *c, int ms) {
    if (unusable(c)) {
        nap(ms);
        return;
    }
    if (ms <= 0) {
        ev_run(c->loop, EVRUN_NOWAIT);
    } else {
        rl_client_arm_run_timer(c, ms);
        while (!c->run_expired) ev_run(c->loop, EVRUN_ONCE);
    }
    rl_client_flush(c);
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
        rl_client_flush(c);
        if (!rl_engine_cleanup_unwritten(c->engine, id)) break;
        ev_run(c->loop, EVRUN_ONCE);
    }
}

int rl_collect(rl_client *c, rl_result *out) {
    if (unusable(c)) return RL_ERR;
    int id = rl_engine_first_done(c->engine);
    if (id >= 0) write_cleanup(c, id);
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
        rl_client_arm_run_timer(c, (int)left + 1);
        ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    }
}

int rl_wait(rl_client *c, int id, rl_result *out) {
    if (unusable(c)) return RL_ERR;
    int finished;
    while ((finished = rl_engine_finished(c->engine, id)) == 0) ev_run(c->loop, EVRUN_ONCE);
    if (finished < 0) return rl_engine_take(c->engine, id, out); /* RL_ERR, with the reason */
    settle(c, id);
    rl_client_flush(c);
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

int rl_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out) {
    return finish(c, rl_begin_acquire_shared(c, resource, len, ttl_ms), out);
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

int rl_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket,
                    rl_result *out) {
    return finish(c, rl_begin_acquire_slot(c, resource, len, limit, ttl_ms, ticket), out);
}

int rl_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
               rl_result *out) {
    return finish(c, rl_begin_on_slot(c, kind, resource, len, slot, value, ttl_ms), out);
}

/* ---- hand-off: waiting for a release ---- */

int rl_watch(rl_client *c, const char *resource, size_t len) {
    if (unusable(c)) return RL_ERR;
    int id = rl_engine_watch(c->engine, resource, len, rl_now_ms());
    rl_client_flush_subscribers(c);
    return id >= 0 ? RL_OK : RL_ERR;
}

void rl_unwatch(rl_client *c, const char *resource, size_t len) {
    if (unusable(c)) return;
    rl_engine_unwatch(c->engine, resource, len, rl_now_ms());
    rl_client_flush_subscribers(c);
}

void rl_unwatch_won(rl_client *c, const char *resource, size_t len) {
    if (unusable(c)) return;
    rl_engine_unwatch_won(c->engine, resource, len, rl_now_ms());
}

unsigned rl_heard(const rl_client *c, const char *resource, size_t len) {
    return rl_engine_heard(c->engine, resource, len);
}

int rl_heard_listeners(const rl_client *c, const char *resource, size_t len) {
    return rl_engine_heard_listeners(c->engine, resource, len);
}

int rl_sleep_until(rl_client *c, const char *resource, size_t len, unsigned heard, int ms) {
    if (unusable(c)) {
        nap(ms);
        return 0;
    }
    if (ms > 0 && rl_heard(c, resource, len) == heard) {
        rl_client_arm_run_timer(c, ms);
        while (!c->run_expired && rl_heard(c, resource, len) == heard) ev_run(c->loop, EVRUN_ONCE);
        ev_timer_stop(c->loop, &c->run_timer);
    } else {
        ev_run(c->loop, EVRUN_NOWAIT);
    }
    rl_client_flush(c);
    return rl_heard(c, resource, len) != heard;
}

int rl_client_listening(const rl_client *c) {
    return rl_engine_listening(c->engine);
}
