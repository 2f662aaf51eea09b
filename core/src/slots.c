/* slots.c — a semaphore's operations in the engine (docs/design.md,
 * "Semaphores"): what a semaphore's acquire leaves behind on the nodes whose
 * votes did not make the slot held, and the release of a slot, which wakes
 * the semaphore's waiters; a won acquire also leaves the queue of waiters
 * on the nodes whose votes went elsewhere, and a lost one goes back to its
 * place where its slot is undone (command_slots.c). The round itself (the votes per slot) is
 * round.c's; the phases are ops.c's. */
#include "engine_impl.h"
#include "text.h"

/* The next number of the splitmix64 sequence in *state. */
static unsigned long long next_random(unsigned long long *state) {
    unsigned long long z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The order of the slots 1 to limit that seed stands for (Fisher-Yates).
 * An acquire sent again (as EVAL after NOSCRIPT) asks in the order it first
 * asked: a caller outside the queue takes the first free slot of its order,
 * and nodes asked in different orders would split its votes. */
static void draw_order(int *order, int limit, unsigned long long seed) {
    for (int i = 0; i < limit; i++) order[i] = i + 1;
    for (int i = limit - 1; i > 0; i--) {
        int j = (int)(next_random(&seed) % (unsigned long long)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

void rl_slot_draw(rl_op *op) {
    op->sem_seed = (unsigned long long)(rl_random() * 9007199254740992.0); /* 53 random bits */
}

int rl_slot_acquire_cmd(rl_engine *e, rl_op *op, rl_buf *b, rl_buf *cb, int ttl_ms, int by_sha) {
    int order[RL_MAX_LIMIT];
    draw_order(order, op->sem_limit, op->sem_seed);
    const char *waiter = op->sem_ticket > 0 ? rl_engine_waiter_id(e) : NULL;
    if (rl_cmd_acquire_slot(b, by_sha, op->key.data, op->key.len, op->res.value, ttl_ms, waiter, op->sem_ticket,
                            order, op->sem_limit) != 0)
        return -1;
    if (cb == NULL || op->ckey.len == 0) return 0;
    return rl_cmd_acquire_slot(cb, by_sha, op->ckey.data, op->ckey.len, op->res.value, ttl_ms, waiter,
                               op->sem_ticket, order, op->sem_limit);
}

int rl_op_release_cmd(rl_engine *e, const rl_op *op, rl_buf *b, int by_sha, int quiet) {
    if (op->sem_slot == 0)
        return rl_cmd_release(b, by_sha, op->key.data, op->key.len, op->res.value,
                              quiet ? NULL : rl_engine_waiter_id(e));
    size_t head = rl_slot_head_len(op->sem_slot);
    return rl_cmd_release_slot(b, by_sha, op->key.data, op->key.len, op->key.data + head, op->key.len - head,
                               op->res.value, quiet);
}

/* rl_slot_cleanup_cmd for a node that voted for slot voted (0: none, or
 * not known) or refused. */
static int cleanup_cmd(rl_engine *e, const rl_op *op, int voted, int refused, rl_buf *b) {
    int won = op->res.status == RL_STATUS_OK;
    int held = won ? op->res.slot : 0;
    const char *waiter = op->sem_ticket > 0 ? rl_engine_waiter_id(e) : NULL;
    if (voted != 0 && voted == held) return 1; /* the grant here is ours, and it left the queue */
    if (refused && !(won && waiter)) return 1; /* nothing set here; a loser keeps its place */
    /* what this node may have set: the slot it answered, none (refused), or any (no answer) */
    int only = refused ? -1 : voted;
    const char *how = waiter == NULL ? "" : won ? "leave" : "back";
    return rl_cmd_release_slots(b, op->key.data, op->key.len, op->res.value, op->sem_limit, only, held, waiter,
                                op->sem_ticket, how);
}

int rl_slot_cleanup_cmd(rl_engine *e, const rl_op *op, int node, rl_buf *b) {
    return cleanup_cmd(e, op, op->round.voted[node], op->res.node[node].state == RL_NODE_TAKEN, b);
}

/* Send node i op's cleanup for its vote (voted, refused: as cleanup_cmd),
 * owed in the tail (its acquire was written there). A node that cannot
 * take it now (down, or suspect) gets it kept (rl_stream_redo): behind
 * what waits on a suspect node's connection, or on its next connection.
 * Only when it cannot even be kept (no memory, the kept releases full)
 * does the ttl end what may be there; the node's error says so. */
static void send_cleanup(rl_engine *e, rl_op *op, int i, int voted, int refused) {
    rl_ticket t = {.slot = op->slot, .gen = op->gen, .kind = RL_OP_RELEASE, .sent_ms = e->now, .eval = 1};
    int swapped = rl_op_swap_key(e, op, i), rc = cleanup_cmd(e, op, voted, refused, &e->scratch);
    if (swapped) rl_op_swap_key(e, op, -1);
    if (rc != 0) return;
    if (rl_route_send(e, i, op->hslot, e->scratch.data, e->scratch.len, t) == 0) {
        op->owed |= 1u << i;
        return;
    }
    rl_stream *s = rl_route(e, i, op->hslot);
    if (rl_stream_redo(s, e->scratch.data, e->scratch.len, e->now) != 0)
        rl_text_join(s->errstr, sizeof(s->errstr), s->errstr, "; release not kept");
}

void rl_slot_release_strays(rl_engine *e, rl_op *op) {
    for (int i = 0; i < e->nnodes; i++) {
        unsigned bit = 1u << i;
        if (!(op->sent & bit)) continue;
        if (op->res.node[i].state != RL_NODE_PENDING || !(op->owed & bit))
            send_cleanup(e, op, i, op->round.voted[i], op->res.node[i].state == RL_NODE_TAKEN);
        else if (op->round.held & bit) /* its write answered, its WAIT has not: the answer is known */
            send_cleanup(e, op, i, (int)op->round.held_value[i], 0);
        else
            op->deferred |= bit;
    }
}

void rl_slot_tail_answer(rl_engine *e, rl_op *op, int node, const rl_reply *reply) {
    unsigned bit = 1u << node;
    if (!(op->deferred & bit)) return;
    op->deferred &= ~bit;
    if (!(op->sent & bit)) return; /* its acquire was never written: nothing there */
    send_cleanup(e, op, node, rl_round_slot_of(&op->round, reply), reply != NULL && reply->type == RL_REPLY_NIL);
}

void rl_slot_tail_over(rl_engine *e, rl_op *op) {
    for (int i = 0; i < e->nnodes; i++)
        if (op->deferred & (1u << i)) send_cleanup(e, op, i, 0, 0);
    op->deferred = 0;
}
