/* ops.c — the engine's operations once begun: their slots, and the
 * phases each goes through (ROUND, TAIL, CLEANUP, QUIET; see engine.c),
 * driven by the nodes' replies and by each phase's deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "opid.h"
#include "text.h"

rl_op *rl_op_alloc(rl_engine *e) {
    rl_op *op = e->free_ops;
    if (op) {
        e->free_ops = op->next;
        return op;
    }
    if (e->nops == RL_OPID_MAX_SLOTS) return NULL;
    if (e->nops == e->capops) {
        int cap = e->capops ? e->capops * 2 : 16;
        rl_op **ops = realloc(e->ops, (size_t)cap * sizeof(*ops));
        if (!ops) return NULL;
        e->ops = ops;
        e->capops = cap;
    }
    if (rl_deadlines_reserve(&e->deadlines, e->nops + 1) != 0) return NULL;
    op = calloc(1, sizeof(*op));
    if (!op) return NULL;
    op->slot = e->nops;
    e->ops[e->nops++] = op;
    return op;
}

void rl_op_free(rl_engine *e, rl_op *op) {
    op->phase = OP_FREE;
    op->next = e->free_ops;
    e->free_ops = op;
}

/* The current phase must end by a node timeout from now. */
static void start_timer(rl_engine *e, rl_op *op) {
    rl_deadlines_set(&e->deadlines, op->slot, e->now + e->opts.node_timeout_ms);
}

/* The round is decided: its result goes on the done list for the caller
 * (a keep-alive round's, to the schedule). */
static void op_publish(rl_engine *e, rl_op *op) {
    op->res.token = op->round.kind == RL_ROUND_COMMIT && op->res.status == RL_STATUS_OK ? op->token : 0;
    if (e->nclusters > 0) rl_cluster_name_masters(e, &op->res, op->hslot);
    if (op->kept.entry >= 0) {
        e->inflight--;
        rl_keep_result(&e->keep, op->kept, &op->res, e->now);
        return;
    }
    op->prev = e->done_tail;
    op->next = NULL;
    if (e->done_tail) e->done_tail->next = op;
    else e->done_head = op;
    e->done_tail = op;
    e->ndone++;
    e->inflight--;
}

/* Nothing more is owed to the operation: replies still to come are late,
 * and are ignored. The slot is freed if its result was taken. */
static void op_quiet(rl_engine *e, rl_op *op) {
    rl_deadlines_remove(&e->deadlines, op->slot);
    if (op->phase == OP_TAIL || op->phase == OP_CLEANUP) e->tails--;
    op->gen++;
    op->phase = OP_QUIET;
    op->owed = op->deferred = 0;
    if (op->taken) rl_op_free(e, op);
}

/* Keep a (quiet) release of op's value for node i, to go out once it can:
 * at once behind what waits on a suspect node's connection, or on the
 * node's next connection: a slot's release
 * on the slot's key, and for a semaphore's acquire whatever it may have set
 * there (rl_slot_cleanup_cmd; nothing to undo is 0). Return 0, or -1 if it
 * cannot be kept (out of memory, RL_REDO_MAX bytes kept already). */
static int keep_release(rl_engine *e, rl_op *op, int i) {
    int swapped = rl_op_swap_key(e, op, i);
    int rc = op->sem_limit > 0 ? rl_slot_cleanup_cmd(e, op, i, &e->scratch) : rl_op_release_cmd(e, op, &e->scratch, 0, 1);
    if (swapped) rl_op_swap_key(e, op, -1);
    if (rc != 0) return rc > 0 ? 0 : -1;
    const rl_buf *cmd = rl_op_scratch_for(e, op, i);
    return cmd ? rl_stream_redo(rl_route(e, i, op->hslot), cmd->data, cmd->len, e->now) : -1;
}

/* The cleanup could not go out to node i on the connection the SET went
 * out on (that connection ended first, with the SET applied or not): keep
 * the release for the node's next connection (EVAL, whatever scripts that
 * node has then). Unless the SET itself never went out. Return 0, or -1 if
 * it cannot be kept. */
static int redo_cleanup(rl_engine *e, rl_op *op, int i) {
    return op->sent & (1u << i) ? keep_release(e, op, i) : 0;
}

/* A failed acquire: release on every node the SET may have reached. A node
 * that answered "taken" holds another value, never ours, so it is skipped.
 * A node that is down now (its connection ended after the SET went out)
 * gets the release on its next connection (redo_cleanup). If the release
 * cannot even be encoded or kept (out of memory), the result says so on
 * every node it was meant for: the key stays there until its ttl. */
static void op_start_cleanup(rl_engine *e, rl_op *op) {
    op->gen++;
    op->phase = OP_CLEANUP;
    op->owed = 0;
    op->cleanup_sent = 0;
    int encoded = rl_cmd_release(&op->cmd, 1, op->key.data, op->key.len, op->res.value, NULL) == 0 &&
                  rl_op_cluster_form(e, op, &op->cmd, &op->ccmd) >= 0;
    rl_ticket t = {op->slot, op->gen, RL_OP_RELEASE, e->now, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < e->nnodes; i++) {
        rl_node_result *n = &op->res.node[i];
        if (!(op->sent & (1u << i)) || n->state == RL_NODE_TAKEN) continue;
        const rl_buf *cmd = rl_op_cmd(e, op, i); /* a semaphore's: what this node may have taken */
        if (op->sem_limit > 0) {
            int swapped = rl_op_swap_key(e, op, i);
            encoded = rl_slot_cleanup_cmd(e, op, i, (rl_buf *)(cmd = &e->scratch)) == 0;
            if (swapped) rl_op_swap_key(e, op, -1);
        }
        if (encoded && rl_route_send(e, i, op->hslot, cmd->data, cmd->len, t) == 0) {
            op->owed |= 1u << i;
            op->cleanup_sent |= 1u << i;
            op->cleanup_out[i] = rl_stream_mark(rl_route(e, i, op->hslot));
        } else if ((!encoded || redo_cleanup(e, op, i) != 0) && n->errstr[0] == '\0') {
            /* keep a failed vote's own reason; otherwise say why the key may stay */
            snprintf(n->errstr, sizeof(n->errstr), "%s", encoded ? "cleanup not sent: node down, no room to keep it" : "cleanup not sent: out of memory");
        }
    }
    e->tails++;
    rl_count_cleanup(e);
    if (op->owed) start_timer(e, op);
    else op_quiet(e, op);
}

/* See engine_impl.h. The result is dropped, so what the acquire may have
 * taken is undone as a failed acquire's is: a semaphore's slot held too
 * (no slot held), a waiter's place in the queue kept where a slot is
 * undone, as for a waiter that lost. */
void rl_op_abandon(rl_engine *e, rl_op *op) {
    if (op->phase == OP_ROUND) e->inflight--; /* never published */
    if (op->phase == OP_TAIL) e->tails--;
    rl_deadlines_remove(&e->deadlines, op->slot);
    op->taken = 1;
    op->deferred = 0;
    op->res.status = RL_STATUS_UNAVAILABLE;
    op->res.slot = 0;
    op_start_cleanup(e, op);
}

/* A healthy node answers within the node timeout. One that did not, to a
 * command it was sent, may be out of step (a reply lost in flight shifts the
 * stream for good: each reply then answers the command before its own), may
 * hang (the stall watchdog resets it), or may be working through a backlog (a
 * large batch): a step check tells them apart without resetting a backlog,
 * which would throw away what is queued behind it (the cleanups of failed
 * acquires) while the commands already sent still run. */
static void check_late_nodes(rl_engine *e, rl_op *op) {
    for (int i = 0; i < e->nnodes; i++)
        if (op->owed & (1u << i)) {
            rl_count_late(e, op, i);
            rl_stream_check_step(rl_route(e, i, op->hslot), e->now);
        }
}

/* The round is decided; timed_out: by its node timeout, so the nodes still
 * owing a reply are late (a late reply will be ignored). Otherwise they are
 * the tail, served until the same node timeout. A granted fenced acquire
 * goes on to commit its token (the highest counter a grant returned); a
 * failed acquire goes on to its cleanup. */
static void op_round_decided(rl_engine *e, rl_op *op, int timed_out) {
    rl_count_decided(e, op);
    if (timed_out) check_late_nodes(e, op);
    if (op->round.kind == RL_ROUND_ACQUIRE_FENCED && op->res.status == RL_STATUS_OK) {
        op->token = op->round.top;
        if (rl_cmd_commit(&op->cmd, op->key.data, op->key.len, op->key.data, op->key.len, op->res.value, op->token) == 0 &&
            (op->ccmd.len == 0 || (rl_cluster_base(&e->base, op->key.data, op->key.len) == 0 &&
                                   rl_cmd_commit(&op->ccmd, op->key.data, op->key.len, e->base.data, e->base.len,
                                                 op->res.value, op->token) == 0))) {
            rl_op_send_round(e, op, RL_ROUND_COMMIT, op->round.start_ms, 0);
            return;
        }
        op->res.status = RL_STATUS_UNAVAILABLE; /* no memory for the commit: no token, no grant */
    }
    op_publish(e, op);
    if (op->res.op == RL_OP_ACQUIRE && op->res.status != RL_STATUS_OK) {
        rl_deadlines_remove(&e->deadlines, op->slot);
        op_start_cleanup(e, op);
        return;
    }
    if (op->sem_limit > 0 && op->res.op == RL_OP_ACQUIRE) rl_slot_release_strays(e, op);
    if (op->owed && !timed_out) {
        op->phase = OP_TAIL; /* the round's deadline stays */
        e->tails++;
        rl_count_tail(e);
    } else {
        op_quiet(e, op);
    }
}

/* Which write of node i a WAIT stands behind: its ticket's EVAL flag,
 * redirections and sends after TRYAGAIN. Each resend of a write (as EVAL
 * after NOSCRIPT, where MOVED/ASK points, or after TRYAGAIN) raises one of
 * them, so along one write's resends the mark never repeats. */
static unsigned char wait_mark(rl_ticket t) {
    _Static_assert(RL_CLUSTER_REDIRECTS * 2 + 1 < 16 && RL_TRYAGAIN_MAX * 16 + 15 < 256, "wait_mark fits a byte");
    return (unsigned char)(t.tryagains * 16 + t.redirects * 2 + t.eval);
}

/* The ticket of the WAIT that goes behind a write of ticket t. */
static rl_ticket wait_ticket(rl_ticket t) {
    t.kind = RL_ROUND_REPLICAS;
    return t;
}

/* Send node i cmd with ticket t: behind it its WAIT when the round's kind
 * waits for replicas there (replicas.h), whose yes is then held until WAIT
 * answers; that WAIT now decides node i's vote. Return as rl_stream_send. */
static int send_write(rl_engine *e, rl_op *op, int i, const char *cmd, size_t len, rl_ticket t) {
    if (!rl_replicas_waits(&e->replicas, t.kind, i)) return rl_route_send(e, i, op->hslot, cmd, len, t);
    if (rl_route_send_pair(e, i, op->hslot, cmd, len, t, e->replicas.cmd[i], e->replicas.len[i], wait_ticket(t)) != 0)
        return -1;
    op->waits |= 1u << i;
    op->wait_mark[i] = wait_mark(t);
    if (op->phase == OP_ROUND) rl_round_await(&op->round, i);
    return 0;
}

/* See engine_impl.h. */
void rl_op_redirected(rl_engine *e, rl_shard *to, int node, rl_ticket t) {
    rl_op *op = e->ops[t.slot];
    if (!(op->waits & (1u << node)) || !rl_replicas_waits(&e->replicas, t.kind, node)) return;
    op->wait_mark[node] = wait_mark(t);
    /* if even that cannot be sent (out of memory), the held yes times out */
    (void)rl_shard_send(to, e->replicas.cmd[node], e->replicas.len[node], wait_ticket(t));
}

/* See engine_impl.h. */
int rl_op_may_resend(const rl_engine *e, rl_ticket t) {
    if (t.slot < 0 || t.slot >= e->nops) return 0;
    const rl_op *op = e->ops[t.slot];
    if (op->gen != t.gen || op->phase == OP_QUIET || op->phase == OP_FREE) return 0;
    return t.kind == RL_OP_RELEASE || t.kind == RL_OP_EXTEND || op->phase == OP_ROUND;
}

/* See engine_impl.h. */
void rl_op_resend_later(rl_engine *e, int node, rl_ticket t) {
    rl_op *op = e->ops[t.slot];
    if (op->waits & (1u << node)) op->wait_mark[node] = wait_mark(t);
}

/* See engine_impl.h. */
void rl_op_resend_refused(rl_engine *e, rl_stream *s, int node, rl_ticket t, const rl_reply *reply,
                          const char *errstr) {
    if (t.slot < 0 || t.slot >= e->nops) return;
    rl_op *op = e->ops[t.slot];
    if (op->gen == t.gen) op->waits &= ~(1u << node); /* its WAIT was answered already, and ignored */
    rl_op_reply_from(e, s, node, t, reply, errstr);
}

/* The reply to node's WAIT: it decides the vote its write's yes held, if
 * it stands behind the latest send of that write. One left behind a write
 * that went again (as EVAL after NOSCRIPT, or where MOVED/ASK pointed) is
 * answered too, and proves nothing. */
static void replicas_reply(rl_engine *e, rl_op *op, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    if (wait_mark(t) != op->wait_mark[node]) return;
    op->owed &= ~(1u << node);
    if (op->phase == OP_ROUND) {
        if (rl_round_replicas(&op->round, node, reply, errstr, e->replicas.want[node], e->replicas.timeout_ms, e->now))
            op_round_decided(e, op, 0);
    } else if (op->owed == 0) {
        op_quiet(e, op);
    }
}

static int is_noscript(const rl_reply *r) {
    return r && r->type == RL_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* The node has flushed its scripts: send the script itself (EVAL) instead
 * (a semaphore's acquire in the order of slots it was first sent in). */
static int resend_as_eval(rl_engine *e, rl_op *op, int node, rl_ticket t) {
    int swapped = rl_op_swap_key(e, op, node);
    int rc = t.kind == RL_OP_RELEASE
                 ? rl_op_release_cmd(e, op, &e->scratch, 0, op->quiet || op->phase == OP_CLEANUP)
             : t.kind == RL_ROUND_ACQUIRE_SLOT
                 ? rl_slot_acquire_cmd(e, op, &e->scratch, NULL, op->ttl_ms, 0)
                 : rl_cmd_extend(&e->scratch, 0, op->key.data, op->key.len, op->res.value, op->ttl_ms);
    if (swapped) rl_op_swap_key(e, op, -1);
    const rl_buf *cmd = rc == 0 ? rl_op_scratch_for(e, op, node) : NULL;
    if (cmd == NULL) return -1;
    t.sent_ms = e->now;
    t.eval = 1;
    return send_write(e, op, node, cmd->data, cmd->len, t);
}

/* See engine_impl.h. */
void rl_op_reply(void *owner, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    rl_engine *e = owner;
    rl_op_reply_from(e, &e->nodes[node], node, t, reply, errstr);
}

/* See engine_impl.h. */
void rl_op_reply_from(rl_engine *e, rl_stream *s, int node, rl_ticket t, const rl_reply *reply, const char *errstr) {
    if (t.slot < 0 || t.slot >= e->nops) return;
    if (reply && !rl_reply_fits(t.kind, reply)) {
        /* This reply answers some other command (out of step), or the node
         * is broken. Nothing on this connection can be trusted any more. */
        char why[RL_NODE_ERR_LEN];
        rl_stream_reset(s, rl_reply_misfit_text(t.kind, reply, why, sizeof(why)), e->now);
        reply = NULL;
        errstr = s->errstr;
    }
    rl_op *op = e->ops[t.slot];
    /* a write with a WAIT behind it is timed by the WAIT's reply: its vote's */
    int write_of_wait = rl_replicas_waits(&e->replicas, t.kind, node) && t.kind != RL_ROUND_REPLICAS &&
                        op->gen == t.gen && (op->waits & (1u << node));
    if (reply && !write_of_wait) rl_count_reply(e, node, t.sent_ms);
    /* A SET whose connection ended before it was written never ran: no
     * cleanup needs to reach that node later. */
    if (!reply && t.unsent && t.gen == op->set_gen && t.kind != RL_ROUND_REPLICAS) {
        op->sent &= ~(1u << node);
        if (op->res.op == RL_OP_ACQUIRE) rl_skipped_note(&s->skipped, op->res.value); /* (see not_sent) */
    }
    if (op->gen != t.gen) {
        /* A late reply to an earlier phase or operation. A late NOSCRIPT has
         * no round left to fall back to EVAL for (which would have loaded
         * the script): load the scripts, for every later command. */
        if (is_noscript(reply)) rl_stream_load_scripts(s, e->now);
        return;
    }
    /* A script the node does not know is sent as EVAL, once, in the round
     * or its tail alike. (NOSCRIPT to a SET is just a failed vote: there is
     * no script to send; a fenced lock's scripts always go as EVAL.) A
     * semaphore's acquire goes again only while its round is open: once it
     * is decided, the caller may have released the slot already, and an
     * acquire sent behind that release would take the slot again there, for
     * its ttl. In the tail the node ran nothing, which its cleanup covers,
     * and it is taught the scripts for the acquires to come. */
    if (is_noscript(reply) && !t.eval) {
        int may_resend = t.kind == RL_OP_RELEASE || t.kind == RL_OP_EXTEND ||
                         (t.kind == RL_ROUND_ACQUIRE_SLOT && op->phase == OP_ROUND);
        if (may_resend && resend_as_eval(e, op, node, t) == 0) return;
        if (!may_resend) rl_stream_load_scripts(s, e->now);
    }
    if (t.kind == RL_ROUND_REPLICAS) {
        replicas_reply(e, op, node, t, reply, errstr);
        return;
    }
    if (!write_of_wait) op->owed &= ~(1u << node); /* else its WAIT still owes */
    if (op->deferred && t.kind == RL_ROUND_ACQUIRE_SLOT) rl_slot_tail_answer(e, op, node, reply);
    /* The cleanup's connection ended, or its setup was given up on, before
     * the cleanup was written: keep it for the node's next connection (if
     * the SET may have run), and wait no more for its bytes to go out. */
    if (!reply && t.unsent && op->phase == OP_CLEANUP) {
        op->cleanup_sent &= ~(1u << node);
        redo_cleanup(e, op, node);
    }
    if (op->phase == OP_ROUND) {
        int decided;
        if (is_noscript(reply) && t.eval) {
            /* The script itself was refused as unknown: a node that cannot
             * run it fails its vote, without another try. */
            char why[RL_NODE_ERR_LEN];
            snprintf(why, sizeof(why), "NOSCRIPT after EVAL: %.*s", (int)sizeof(why) - 22, reply->str);
            decided = rl_round_vote(&op->round, node, RL_NODE_ERROR, why, e->now);
        } else if (!reply && rl_stream_suspect(s)) {
            /* taken back from a node that stopped answering: its silence */
            decided = rl_round_vote(&op->round, node, RL_NODE_TIMEOUT, errstr, e->now);
        } else {
            decided = rl_round_reply(&op->round, node, reply, errstr, e->now);
        }
        if (decided) op_round_decided(e, op, 0);
    } else {
        /* a keep-alive extension's tail node whose connection was lost: it
         * may run the command later, or never */
        if (!reply && op->phase == OP_TAIL && op->kept.entry >= 0) op->res.node[node].state = RL_NODE_ERROR;
        if (op->owed == 0) {
            if (op->phase == OP_TAIL && op->kept.entry >= 0) rl_keep_settled(&e->keep, op->kept, &op->res);
            op_quiet(e, op); /* the tail, or the cleanup, is complete */
        }
    }
}

/* Has every node that was sent the cleanup been handed its bytes (or lost
 * the connection, or stopped answering)? A cleanup that times out is done
 * only then: the caller may stop driving the engine once it has the
 * result, and the release must not be left in our buffer while the SET it
 * undoes is on the node. A node that has stopped (suspect) is not waited
 * for: its end may take nothing for as long as it stays stopped, and
 * resetting its connection would throw away what its kernel holds already
 * (the node, run again, finds the connection gone after the first chunk it
 * reads). The cleanup stays queued behind that, and goes out when the
 * client is next driven with room on the socket. */
int rl_op_cleanup_out(rl_engine *e, const rl_op *op) {
    for (int i = 0; i < e->nnodes; i++) {
        const rl_stream *s = rl_route(e, i, op->hslot);
        if ((op->cleanup_sent & (1u << i)) && !rl_stream_passed(s, op->cleanup_out[i]) && !rl_stream_suspect(s))
            return 0;
    }
    return 1;
}

/* The round's node timeout passed: every node yet to vote times out. One
 * whose connection is still being made or set up says so (and how long it
 * has been at it); the connection goes on until its connect deadline. One
 * whose write said yes and whose WAIT is still blocked says that, and one
 * whose command waits to go again after a TRYAGAIN says what it met. */
static void op_expire_round(rl_engine *e, rl_op *op) {
    char why[RL_NODE_ERR_LEN];
    for (int i = 0; i < e->nnodes; i++) {
        if (op->res.node[i].state != RL_NODE_PENDING) continue;
        if (op->round.held & (1u << i))
            snprintf(why, sizeof(why), "no reply to WAIT within %d ms: the write is on the node, not known on %d %s",
                     e->opts.node_timeout_ms, e->replicas.want[i], e->replicas.want[i] == 1 ? "replica" : "replicas");
        else if (!rl_stream_setup_text(rl_route(e, i, op->hslot), e->now, why, sizeof(why)) &&
                 !rl_cluster_retry_text(e, op->slot, op->gen, i, why, sizeof(why)))
            continue;
        if (rl_round_vote(&op->round, i, RL_NODE_TIMEOUT, why, e->now)) break;
    }
    rl_round_expire(&op->round, e->timeout_text, e->now);
    op_round_decided(e, op, 1);
}

/* See engine_impl.h. */
void rl_op_timeout(rl_engine *e, rl_op *op) {
    if (op->phase == OP_ROUND) {
        op_expire_round(e, op);
    } else if (op->phase == OP_TAIL) {
        check_late_nodes(e, op);
        if (op->deferred) rl_slot_tail_over(e, op);
        op_quiet(e, op);
    } else if (op->phase == OP_CLEANUP) {
        /* A connection whose setup is still under way has sent neither the
         * SET nor the cleanup: take back what waits behind its setup, so
         * neither goes out later while nobody drives the engine. The
         * connection itself lives on until its connect deadline. The
         * tickets are answered at once, which may complete this operation. */
        unsigned gen = op->gen;
        for (int i = 0; i < e->nnodes; i++)
            if (op->owed & (1u << i)) rl_count_late(e, op, i);
        for (int i = 0; i < e->nnodes; i++)
            if (op->cleanup_sent & (1u << i)) rl_stream_withdraw_held(rl_route(e, i, op->hslot), e->now);
        if (op->phase != OP_CLEANUP || op->gen != gen) return;
        if (rl_op_cleanup_out(e, op)) op_quiet(e, op);
        else start_timer(e, op); /* still in our buffer: a socket that was full */
    } else {
        rl_deadlines_remove(&e->deadlines, op->slot);
    }
}

/* A round's command that node i could not take (suspect, or down until
 * its reconnect backoff has passed). An acquire's value is noted: its key
 * is not there. A release of a value not noted is kept (and goes out behind
 * what waits on the connection, or on the next one): the key may be there
 * (its SET went out before the node stopped or its connection ended); its
 * vote says so if it cannot be kept. */
static void not_sent(rl_engine *e, rl_op *op, int i, int first) {
    rl_stream *s = rl_route(e, i, op->hslot);
    static const char not_kept[] = "; release not kept";
    if (op->res.op == RL_OP_ACQUIRE && first) {
        rl_skipped_note(&s->skipped, op->res.value);
    } else if (op->round.kind == RL_OP_RELEASE && !rl_skipped_take(&s->skipped, op->res.value) &&
               keep_release(e, op, i) != 0 && strstr(s->errstr, not_kept) == NULL) {
        rl_text_join(s->errstr, sizeof(s->errstr), s->errstr, not_kept);
    }
}

/* See engine_impl.h. */
void rl_op_send_round(rl_engine *e, rl_op *op, int kind, double start_ms, int first) {
    op->gen++;
    op->phase = OP_ROUND;
    op->owed = op->waits = 0;
    rl_round_start(&op->round, &op->res, kind, e->nnodes, e->quorum, op->ttl_ms, e->opts.drift_factor, start_ms);
    start_timer(e, op);
    unsigned gen = op->gen;
    if (first) op->set_gen = gen;
    rl_ticket t = {op->slot, gen, kind, e->now, 0, 0, 0, 0, 0, 0, 0};
    t.resend = kind == RL_OP_RELEASE; /* a release its node's connection lost goes again on the next */
    /* Every node that can take the command gets it before any failed vote
     * is counted: a round decided by its failures (a quorum of nodes down
     * or suspect) still reaches the others, so a release deletes our value
     * wherever it can. (Sending calls back nothing.) */
    unsigned failed = 0;
    for (int i = 0; i < e->nnodes; i++) {
        const rl_buf *cmd = rl_op_cmd(e, op, i);
        if (send_write(e, op, i, cmd->data, cmd->len, t) == 0) {
            if (first) op->sent |= 1u << i;
            op->owed |= 1u << i;
        } else {
            failed |= 1u << i;
            /* a suspect's vote is lost to its silence, as a timeout */
            if (rl_stream_suspect(rl_route(e, i, op->hslot))) rl_count_late(e, op, i);
            not_sent(e, op, i, first);
        }
    }
    for (int i = 0; i < e->nnodes && op->gen == gen && op->phase == OP_ROUND; i++) {
        if (!(failed & (1u << i))) continue;
        rl_stream *s = rl_route(e, i, op->hslot);
        int state = rl_stream_suspect(s) ? RL_NODE_TIMEOUT : RL_NODE_ERROR;
        if (rl_round_vote(&op->round, i, state, s->errstr, e->now)) op_round_decided(e, op, 0);
    }
}
