/* begin.c — beginning the engine's operations: the checks on what the
 * caller asks, the key and the command, a slot, and the first round. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "opid.h"
#include "shared.h"
#include "value.h"

/* How an acquire asks: SET NX PX, the fenced script, a waiter's SET that
 * joins the queue of waiters on refusal, or a reader's (shared.h); how a
 * release does: waking the waiters (PLAIN) or nobody (QUIET). */
enum { PLAIN, FENCED, QUEUED, QUIET, SHARED };

static int begin(rl_engine *e, int kind, int variant, const char *resource, size_t len, const char *value, int ttl_ms,
                 const rl_keep_ref *kept, double now_ms) {
    if (resource == NULL || len == 0)
        return snprintf(e->errstr, sizeof(e->errstr), "resource must be a non-empty string"), RL_ERR;
    if (len > RL_MAX_KEY_LEN - e->opts.prefix_len)
        return snprintf(e->errstr, sizeof(e->errstr), "resource is longer than a key may be (512 MB with the prefix)"), RL_ERR;
    const char *reserved = rl_reserved_key(e->prefix, e->opts.prefix_len, resource, len);
    if (reserved) return snprintf(e->errstr, sizeof(e->errstr), "resource is reserved: %s", reserved), RL_ERR;
    if (kind != RL_OP_RELEASE && ttl_ms <= 0)
        return snprintf(e->errstr, sizeof(e->errstr), "ttl must be > 0 ms (got %d)", ttl_ms), RL_ERR;
    if (kind != RL_OP_ACQUIRE && (value == NULL || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN))
        return snprintf(e->errstr, sizeof(e->errstr), "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    rl_op *op = rl_op_alloc(e);
    if (op == NULL && e->nops == RL_OPID_MAX_SLOTS)
        return snprintf(e->errstr, sizeof(e->errstr), "too many operations in flight (%d)", RL_OPID_MAX_SLOTS),
               RL_ERR_FULL;
    if (op == NULL) return snprintf(e->errstr, sizeof(e->errstr), "out of memory"), RL_ERR;

    /* key = prefix .. resource */
    op->cmd.len = 0;
    size_t plen = e->opts.prefix_len;
    if (op->key.cap < plen + len) {
        char *p = realloc(op->key.data, plen + len);
        if (!p) goto oom;
        op->key.data = p;
        op->key.cap = plen + len;
    }
    memcpy(op->key.data, e->prefix, plen);
    memcpy(op->key.data + plen, resource, len);
    op->key.len = plen + len;

    int rc;
    if (kind == RL_OP_ACQUIRE) {
        if (rl_value_generate_labelled(op->res.value, e->label) != 0) {
            snprintf(e->errstr, sizeof(e->errstr), "getrandom failed: no randomness for a lock value");
            rl_op_free(e, op);
            return RL_ERR;
        }
        if (variant == SHARED) rl_value_make_shared(op->res.value);
        rc = variant == SHARED ? rl_cmd_shared_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms)
             : variant == FENCED ? rl_cmd_acquire_fenced(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms)
             : variant == QUEUED
                 ? rl_cmd_acquire_queued(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms,
                                         rl_engine_waiter_id(e))
                 : rl_cmd_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms);
    } else {
        memcpy(op->res.value, value, RL_VALUE_LEN);
        op->res.value[RL_VALUE_LEN] = '\0';
        rc = kind == RL_OP_RELEASE ? rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, value, variant == QUIET)
                                   : rl_cmd_extend(&op->cmd, 1, op->key.data, op->key.len, value, ttl_ms);
    }
    if (rc != 0) goto oom;

    double now = clock_at(e, now_ms);
    op->uses++;
    op->res.id = rl_opid_make(op->uses, op->slot);
    op->kept = kept ? *kept : (rl_keep_ref){-1, 0};
    op->taken = kept != NULL; /* nobody takes a keep-alive round's result */
    op->sent = 0;
    op->late = 0;
    op->ttl_ms = ttl_ms;
    op->quiet = variant == QUIET;
    e->inflight++;
    rl_op_send_round(e, op, variant == FENCED ? RL_ROUND_ACQUIRE_FENCED : kind, now, 1);
    return op->res.id;

oom:
    snprintf(e->errstr, sizeof(e->errstr), "out of memory");
    rl_op_free(e, op);
    return RL_ERR;
}

int rl_engine_begin_acquire(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, PLAIN, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_fenced(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, FENCED, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_queued(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, QUEUED, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_shared(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, SHARED, resource, len, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_release(rl_engine *e, const char *resource, size_t len, const char *value, double now_ms) {
    return begin(e, RL_OP_RELEASE, PLAIN, resource, len, value, 0, NULL, now_ms);
}

int rl_engine_begin_release_quiet(rl_engine *e, const char *resource, size_t len, const char *value,
                                  double now_ms) {
    return begin(e, RL_OP_RELEASE, QUIET, resource, len, value, 0, NULL, now_ms);
}

int rl_engine_begin_extend(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                           double now_ms) {
    return begin(e, RL_OP_EXTEND, PLAIN, resource, len, value, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_kept(rl_engine *e, int kind, const char *resource, size_t len, const char *value, int ttl_ms,
                         rl_keep_ref ref, double now_ms) {
    return begin(e, kind, PLAIN, resource, len, value, ttl_ms, &ref, now_ms);
}
