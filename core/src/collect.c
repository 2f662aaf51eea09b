/* collect.c — handing decided operations back (the done list), what a
 * driver asks before it does (redlock.h: rl_engine_finished,
 * rl_engine_first_done, rl_engine_cleanup_unwritten,
 * rl_engine_held_until), and undoing the acquires nobody will collect
 * (rl_engine_abandon). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"
#include "opid.h"

static void done_unlink(rl_engine *e, rl_op *op) {
    if (op->prev) op->prev->next = op->next;
    else e->done_head = op->next;
    if (op->next) op->next->prev = op->prev;
    else e->done_tail = op->prev;
    op->prev = op->next = NULL;
    e->ndone--;
}

static void copy_result(const rl_op *op, rl_result *out) {
    size_t head = offsetof(rl_result, node);
    memcpy(out, &op->res, head + (size_t)op->res.nodes * sizeof(rl_node_result));
}

/* The operation id names, or NULL if it is not in flight (never begun, or
 * already collected: a tail left running belongs to nobody). */
static rl_op *op_of(const rl_engine *e, int id) {
    if (id < 0 || rl_opid_slot(id) >= e->nops) return NULL;
    rl_op *op = e->ops[rl_opid_slot(id)];
    return op->phase != OP_FREE && !op->taken && op->res.id == id ? op : NULL;
}

/* Hand a decided operation's result to the caller. Its slot is freed now,
 * or when its tail ends. */
static void op_take(rl_engine *e, rl_op *op, rl_result *out) {
    done_unlink(e, op);
    if (out != NULL) copy_result(op, out);
    op->taken = 1;
    if (op->phase == OP_QUIET) rl_op_free(e, op);
}

int rl_engine_collect(rl_engine *e, rl_result *out) {
    rl_op *op = e->done_head;
    if (op == NULL) return 0;
    op_take(e, op, out);
    return 1;
}

int rl_engine_take(rl_engine *e, int id, rl_result *out) {
    rl_op *op = op_of(e, id);
    if (op == NULL) {
        snprintf(e->errstr, sizeof(e->errstr), "no operation %d in flight", id);
        return RL_ERR;
    }
    if (op->phase == OP_ROUND) return 0;
    op_take(e, op, out);
    return 1;
}

int rl_engine_finished(const rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    return op == NULL ? RL_ERR : op->phase != OP_ROUND;
}

int rl_engine_done(const rl_engine *e) {
    return e->ndone;
}

int rl_engine_inflight(const rl_engine *e) {
    return e->inflight;
}

int rl_engine_tails(const rl_engine *e) {
    return e->tails;
}

int rl_engine_unwritten(const rl_engine *e) {
    int n = 0;
    for (int i = 0; i < e->nnodes; i++) n += rl_stream_unwritten(&e->nodes[i]);
    for (int k = 0; k < e->nshards; k++) n += rl_stream_unwritten(&e->shards[k]->st);
    return n;
}

int rl_engine_unanswered(const rl_engine *e) {
    int n = 0;
    for (int i = 0; i < e->nnodes; i++) n += rl_stream_unanswered(&e->nodes[i]);
    for (int k = 0; k < e->nshards; k++) n += rl_stream_unanswered(&e->shards[k]->st);
    return n;
}

int rl_engine_cleanup_unwritten(rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    return op != NULL && op->phase == OP_CLEANUP && !rl_op_cleanup_out(e, op);
}

int rl_engine_first_done(const rl_engine *e) {
    return e->done_head ? e->done_head->res.id : -1;
}

double rl_engine_held_until(const rl_engine *e, int id) {
    rl_op *op = op_of(e, id);
    double until = 0;
    for (int i = 0; op && i < e->nnodes; i++) {
        double since = op->sent & (1u << i) ? rl_stream_held_since(rl_route((rl_engine *)e, i, op->hslot)) : 0;
        if (since > 0 && since + e->opts.node_timeout_ms > until) until = since + e->opts.node_timeout_ms;
    }
    return until;
}

/* An acquire of the driver's (not a keep-alive round) whose result nobody
 * has taken, and which may hold a key: undecided, or granted. (One that
 * failed has its cleanup already.) */
static int abandoned(const rl_op *op) {
    if (op->taken || op->kept.entry >= 0 || op->res.op != RL_OP_ACQUIRE) return 0;
    return op->phase == OP_ROUND ||
           ((op->phase == OP_TAIL || op->phase == OP_QUIET) && op->res.status == RL_STATUS_OK);
}

/* rl_stream_withdraw's choice: a command of an abandoned acquire's current
 * phase. Its node no longer owes it; its first round's SET taken back
 * never ran there, so no cleanup goes there for it. */
static int withdraw_abandoned(void *owner, int node, rl_ticket t) {
    rl_engine *e = owner;
    if (t.slot < 0 || t.slot >= e->nops) return 0;
    rl_op *op = e->ops[t.slot];
    if (op->gen != t.gen || !abandoned(op)) return 0;
    op->owed &= ~(1u << node);
    if (t.gen == op->set_gen && t.kind != RL_ROUND_REPLICAS) op->sent &= ~(1u << node);
    return 1;
}

/* Taking a command back is done on a plain node's stream only: a cluster
 * node's shard keeps its own copy of every command it awaits a reply to
 * (for MOVED and ASK), and its acquire goes out, its release behind it. */
void rl_engine_abandon(rl_engine *e, double now_ms) {
    clock_at(e, now_ms);
    for (int i = 0; i < e->nnodes; i++)
        if (e->clusters[i] == NULL) rl_stream_withdraw(&e->nodes[i], withdraw_abandoned, e);
    for (int slot = 0; slot < e->nops; slot++) {
        rl_op *op = e->ops[slot];
        if (!abandoned(op)) continue;
        if (op->phase != OP_ROUND) done_unlink(e, op);
        rl_op_abandon(e, op);
    }
}
