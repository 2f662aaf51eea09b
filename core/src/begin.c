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

/* A fenced acquire's grant: on plain nodes with the counter key:fence, on
 * cluster nodes (if the engine has any, and the name differs there) with
 * base:fence, base the key's companion base, in the key's slot. */
static int fenced_cmd(rl_engine *e, rl_op *op, int ttl_ms) {
    const char *key = op->key.data;
    size_t len = op->key.len;
    if (rl_cmd_acquire_fenced(&op->cmd, key, len, key, len, op->res.value, ttl_ms) != 0) return -1;
    if (op->hslot < 0) return 0;
    if (rl_cluster_base(&e->base, key, len) != 0) return -1;
    if (e->base.len == len && memcmp(e->base.data, key, len) == 0) return 0;
    return rl_cmd_acquire_fenced(&op->ccmd, key, len, e->base.data, e->base.len, op->res.value, ttl_ms);
}

/* The acquire's command (op->key: the lock's key, or a semaphore's). */
static int acquire_cmd(rl_engine *e, rl_op *op, int variant, int ttl_ms) {
    const char *waiter = variant == QUEUED ? rl_engine_waiter_id(e) : NULL;
    if (op->sem_limit > 0) {
        rl_slot_draw(op);
        return rl_slot_acquire_cmd(e, op, &op->cmd, &op->ccmd, ttl_ms, 1);
    }
    return variant == SHARED ? rl_cmd_shared_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms)
           : variant == FENCED ? fenced_cmd(e, op, ttl_ms)
           : waiter          ? rl_cmd_acquire_queued(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms, waiter)
                             : rl_cmd_acquire(&op->cmd, op->key.data, op->key.len, op->res.value, ttl_ms);
}

/* A release or an extension of op's key (a lock's, or a slot's). */
static int on_key_cmd(rl_engine *e, rl_op *op, rl_buf *b, int kind, int variant, int ttl_ms) {
    return kind == RL_OP_RELEASE ? rl_op_release_cmd(e, op, b, 1, variant == QUIET)
                                 : rl_cmd_extend(b, 1, op->key.data, op->key.len, op->res.value, ttl_ms);
}

/* On an engine with cluster nodes, a semaphore's names there (op->ckey):
 * for its acquire, the base of its key (op->key, the lock's key), which
 * its scripts name every slot, queue and channel after; for a slot's
 * release or extension, that slot's key made from the base. Nothing when
 * the base is the key itself. 0, or -1 when out of memory. */
static int semaphore_ckey(rl_engine *e, rl_op *op) {
    op->ckey.len = 0;
    if (e->nclusters == 0 || (op->sem_limit == 0 && op->sem_slot == 0)) return 0;
    if (rl_cluster_base(&e->base, op->key.data, op->key.len) != 0) return -1;
    if (e->base.len == op->key.len && memcmp(e->base.data, op->key.data, op->key.len) == 0) return 0;
    if (op->sem_slot > 0) return rl_slot_key(&op->ckey, e->base.data, e->base.len, op->sem_slot);
    if (rl_buf_reserve(&op->ckey, e->base.len) != 0) return -1;
    memcpy(op->ckey.data, e->base.data, e->base.len);
    op->ckey.len = e->base.len;
    return 0;
}

/* See engine.h. */
int rl_engine_check_name(rl_engine *e, const char *resource, size_t len) {
    if (resource == NULL || len == 0)
        return snprintf(e->errstr, sizeof(e->errstr), "resource must be a non-empty string"), -1;
    if (len > RL_MAX_KEY_LEN - e->opts.prefix_len)
        return snprintf(e->errstr, sizeof(e->errstr), "resource is longer than a key may be (%d bytes with the prefix)", RL_MAX_KEY_LEN), -1;
    return 0;
}

int rl_engine_check_resource(rl_engine *e, const char *resource, size_t len) {
    if (rl_engine_check_name(e, resource, len) != 0) return -1;
    const char *reserved = rl_reserved_key(e->prefix, e->opts.prefix_len, resource, len);
    if (reserved) return snprintf(e->errstr, sizeof(e->errstr), "resource is reserved: %s", reserved), -1;
    return 0;
}

/* Begin an operation of kind. sem: a semaphore's limit (an acquire), or the
 * slot released or extended; 0 for a lock. ticket: a semaphore's waiter's
 * (variant QUEUED). */
static int begin(rl_engine *e, int kind, int variant, const char *resource, size_t len, int sem, double ticket,
                 const char *value, int ttl_ms, const rl_keep_ref *kept, double now_ms) {
    if (rl_engine_check_resource(e, resource, len) != 0) return RL_ERR;
    if (kind != RL_OP_RELEASE && ttl_ms <= 0)
        return snprintf(e->errstr, sizeof(e->errstr), "ttl must be > 0 ms (got %d)", ttl_ms), RL_ERR;
    if (sem < 0 || sem > RL_MAX_LIMIT)
        return snprintf(e->errstr, sizeof(e->errstr), "%s must be from 1 to %d (got %d)",
                        kind == RL_OP_ACQUIRE ? "limit" : "slot", RL_MAX_LIMIT, sem), RL_ERR;
    if (kind == RL_OP_ACQUIRE && sem > 0 && (size_t)sem * (len + e->opts.prefix_len + 24) > RL_MAX_SLOT_KEYS)
        return snprintf(e->errstr, sizeof(e->errstr),
                        "limit %d with a key of %zu bytes: the acquire would name %zu bytes of slot keys (at most %d)",
                        sem, len + e->opts.prefix_len, (size_t)sem * (len + e->opts.prefix_len + 24), RL_MAX_SLOT_KEYS),
               RL_ERR;
    if (kind != RL_OP_ACQUIRE && (value == NULL || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN))
        return snprintf(e->errstr, sizeof(e->errstr), "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    rl_op *op = rl_op_alloc(e);
    if (op == NULL && e->nops == RL_OPID_MAX_SLOTS)
        return snprintf(e->errstr, sizeof(e->errstr),
                        "no operation slot free (%d): %d in flight, %d finished and not collected "
                        "(rl_collect / rl_wait them), %d decided with their tails still running",
                        RL_OPID_MAX_SLOTS, e->inflight, e->ndone, e->tails),
               RL_ERR_FULL;
    if (op == NULL) return snprintf(e->errstr, sizeof(e->errstr), "out of memory"), RL_ERR;

    /* key = prefix .. resource */
    op->cmd.len = 0;
    op->ccmd.len = 0;
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
    op->hslot = e->nclusters > 0 ? rl_hash_slot(op->key.data, op->key.len) : -1; /* the lock key's slot */
    op->cbase.len = 0;
    if (e->nclusters > 0 && sem == 0 && rl_cluster_base(&op->cbase, op->key.data, op->key.len) != 0) goto oom;
    op->sem_limit = kind == RL_OP_ACQUIRE ? sem : 0;
    op->sem_slot = kind == RL_OP_ACQUIRE ? 0 : sem;
    op->sem_ticket = op->sem_limit > 0 && variant == QUEUED ? ticket : 0;
    op->res.slot = op->sem_slot;
    if (semaphore_ckey(e, op) != 0) goto oom;
    if (op->sem_slot > 0) { /* the slot's key instead, built in scratch and swapped in */
        if (rl_slot_key(&e->scratch, op->key.data, op->key.len, op->sem_slot) != 0) goto oom;
        rl_buf t = op->key;
        op->key = e->scratch;
        e->scratch = t;
    }

    int rc;
    if (kind == RL_OP_ACQUIRE) {
        if (rl_value_generate_labelled(op->res.value, e->label) != 0) {
            snprintf(e->errstr, sizeof(e->errstr), "getrandom failed: no randomness for a lock value");
            rl_op_free(e, op);
            return RL_ERR;
        }
        if (variant == SHARED) rl_value_make_shared(op->res.value);
        rc = acquire_cmd(e, op, variant, ttl_ms);
    } else {
        memcpy(op->res.value, value, RL_VALUE_LEN);
        op->res.value[RL_VALUE_LEN] = '\0';
        rc = on_key_cmd(e, op, &op->cmd, kind, variant, ttl_ms);
        if (rc == 0 && rl_op_swap_key(e, op, -1)) { /* a slot's, as cluster nodes name it */
            rc = on_key_cmd(e, op, &op->ccmd, kind, variant, ttl_ms);
            rl_op_swap_key(e, op, -1);
        }
    }
    if (rc == 0 && op->ccmd.len == 0) rc = rl_op_cluster_form(e, op, &op->cmd, &op->ccmd) < 0 ? -1 : 0;
    if (rc != 0) goto oom;

    double now = clock_at(e, now_ms);
    op->uses++;
    op->res.id = rl_opid_make(op->uses, op->slot);
    op->kept = kept ? *kept : (rl_keep_ref){-1, 0};
    op->taken = kept != NULL; /* nobody takes a keep-alive round's result */
    op->sent = op->deferred = 0;
    op->late = 0;
    op->ttl_ms = ttl_ms;
    if (kind != RL_OP_RELEASE && ttl_ms > e->max_ttl_ms) e->max_ttl_ms = ttl_ms;
    op->quiet = variant == QUIET;
    e->inflight++;
    int round = op->sem_limit > 0 ? RL_ROUND_ACQUIRE_SLOT : variant == FENCED ? RL_ROUND_ACQUIRE_FENCED : kind;
    op->round.limit = op->sem_limit; /* read by the votes, which may start while it is sent */
    op->round.settle_loss = op->sem_limit > 0 && op->sem_ticket > 0;
    rl_op_send_round(e, op, round, now, 1);
    return op->res.id;

oom:
    snprintf(e->errstr, sizeof(e->errstr), "out of memory");
    rl_op_free(e, op);
    return RL_ERR;
}

int rl_engine_begin_acquire(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, PLAIN, resource, len, 0, 0, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_fenced(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, FENCED, resource, len, 0, 0, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_queued(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, QUEUED, resource, len, 0, 0, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_acquire_shared(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms) {
    return begin(e, RL_OP_ACQUIRE, SHARED, resource, len, 0, 0, NULL, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_release(rl_engine *e, const char *resource, size_t len, const char *value, double now_ms) {
    return begin(e, RL_OP_RELEASE, PLAIN, resource, len, 0, 0, value, 0, NULL, now_ms);
}

int rl_engine_begin_release_quiet(rl_engine *e, const char *resource, size_t len, const char *value,
                                  double now_ms) {
    return begin(e, RL_OP_RELEASE, QUIET, resource, len, 0, 0, value, 0, NULL, now_ms);
}

int rl_engine_begin_extend(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                           double now_ms) {
    return begin(e, RL_OP_EXTEND, PLAIN, resource, len, 0, 0, value, ttl_ms, NULL, now_ms);
}

int rl_engine_begin_kept(rl_engine *e, int kind, const char *resource, size_t len, int slot, const char *value,
                         int ttl_ms, rl_keep_ref ref, double now_ms) {
    return begin(e, kind, PLAIN, resource, len, slot, 0, value, ttl_ms, &ref, now_ms);
}

int rl_engine_begin_acquire_slot(rl_engine *e, const char *resource, size_t len, int limit, int ttl_ms,
                                 double ticket, double now_ms) {
    if (limit < 1 || limit > RL_MAX_LIMIT)
        return snprintf(e->errstr, sizeof(e->errstr), "limit must be from 1 to %d (got %d)", RL_MAX_LIMIT, limit),
               RL_ERR;
    if (!(ticket >= 0 && ticket < RL_TICKET_MAX_MS))
        return snprintf(e->errstr, sizeof(e->errstr),
                        "ticket must be 0 (not a waiter) or rl_wall_ms() when the wait began, from 0 to %.0f "
                        "ms (got %g)",
                        RL_TICKET_MAX_MS, ticket),
               RL_ERR;
    return begin(e, RL_OP_ACQUIRE, ticket > 0 ? QUEUED : PLAIN, resource, len, limit, ticket, NULL, ttl_ms, NULL,
                 now_ms);
}

int rl_engine_begin_on_slot(rl_engine *e, int kind, const char *resource, size_t len, int slot, const char *value,
                            int ttl_ms, double now_ms) {
    if (kind != RL_OP_RELEASE && kind != RL_OP_EXTEND)
        return snprintf(e->errstr, sizeof(e->errstr), "kind must be RL_OP_RELEASE or RL_OP_EXTEND (got %d)", kind),
               RL_ERR;
    if (slot < 1 || slot > RL_MAX_LIMIT)
        return snprintf(e->errstr, sizeof(e->errstr), "slot must be from 1 to %d (got %d)", RL_MAX_LIMIT, slot),
               RL_ERR;
    return begin(e, kind, PLAIN, resource, len, slot, 0, value, ttl_ms, NULL, now_ms);
}
