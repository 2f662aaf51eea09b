/* stats.c — counting inside the engine (stats.h; redlock.h, "Counting"):
 * the counters the engine's files bump through stats.h, and rl_engine_stats,
 * which adds what the streams, keep-alive and hand-off counted themselves
 * and how things stand now. */
#include <string.h>

#include "engine_impl.h"
#include "stats.h"

/* Upper bounds of the histogram buckets, in ms; the last bucket is +Inf. */
static const double bounds_ms[RL_STATS_BUCKETS - 1] = {0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000};

double rl_stats_bucket_ms(int i) {
    return i >= 0 && i < RL_STATS_BUCKETS - 1 ? bounds_ms[i] : -1;
}

const char *rl_stats_kind_word(int kind) {
    static const char *const words[RL_STATS_KINDS] = {NULL, "acquire", "release", "extend", "fenced", "commit", "slot"};
    return kind > 0 && kind < RL_STATS_KINDS ? words[kind] : NULL;
}

void rl_histogram_add(rl_histogram *h, double ms) {
    int i = 0;
    while (i < RL_STATS_BUCKETS - 1 && ms > bounds_ms[i]) i++;
    h->count[i]++;
    h->sum_ms += ms;
}

/* The index a status or vote state counts at (anything unknown at 0). */
static int within(int v, int n) {
    return v >= 0 && v < n ? v : 0;
}

void rl_count_decided(rl_engine *e, const rl_op *op) {
    if (e->opts.no_stats) return;
    rl_stats *s = &e->stats;
    const rl_result *r = &op->res;
    int kind = within(op->round.kind, RL_STATS_KINDS), outcome = within(r->status, RL_STATS_OUTCOMES);
    for (int i = 0; i < r->nodes; i++) s->node[i].votes[within(r->node[i].state, RL_STATS_STATES)]++;
    if (op->kept.entry >= 0) {
        if (kind == RL_OP_EXTEND) s->keep_extends[outcome]++;
        else s->keep_releases[outcome]++;
        return;
    }
    s->ops[kind][outcome]++;
    rl_histogram_add(&s->decision[kind], r->elapsed_ms);
}

void rl_count_tail(rl_engine *e) {
    if (!e->opts.no_stats) e->stats.tails++;
}

void rl_count_cleanup(rl_engine *e) {
    if (!e->opts.no_stats) e->stats.cleanups++;
}

void rl_count_reply(rl_engine *e, int node, double sent_ms) {
    if (!e->opts.no_stats && !e->untimed_reads) rl_histogram_add(&e->stats.node[node].reply, e->now - sent_ms);
}

void rl_engine_untimed_reads(rl_engine *e, int on) {
    e->untimed_reads = on != 0;
}

void rl_count_late(rl_engine *e, rl_op *op, int node) {
    if (e->opts.no_stats || (op->late & (1u << node))) return;
    op->late |= 1u << node;
    e->stats.node[node].timeouts++;
}

/* Watches not undone, over every resource watched. */
static int waiters(const rl_subs *subs) {
    int n = 0;
    for (int id = 0; id < subs->nw; id++) n += subs->w[id].waiters;
    return n;
}

void rl_engine_stats(const rl_engine *e, rl_stats *out) {
    if (e->opts.no_stats) {
        memset(out, 0, sizeof(*out));
        out->nodes = e->nnodes;
        return;
    }
    *out = e->stats;
    out->nodes = e->nnodes;
    for (int i = 0; i < e->nnodes; i++) {
        const rl_stream *st = &e->nodes[i];
        rl_node_stats *n = &out->node[i];
        n->connects = st->counts.connects;
        n->reconnects = st->counts.reconnects;
        n->resets = st->counts.resets;
        n->lost = st->counts.lost;
        n->step_checks = st->counts.step_checks;
        n->suspected = st->counts.suspected;
        n->up = st->state == RL_STREAM_UP && !st->holding;
        n->suspect = rl_stream_suspect(st);
    }
    out->wakeups = e->subs.heard_total;
    out->locks_lost = e->keep.lost_total;
    out->inflight = e->inflight;
    out->tails_running = e->tails;
    out->waiters = waiters(&e->subs);
    out->kept = e->keep.deadlines.n;
}
