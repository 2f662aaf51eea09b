/* watches.c — hand-off's watches (see substream.h): the resources watched,
 * each in a slot that keeps its index (the watch id) while watched, with
 * its channel names (made once per watch) and what was heard on them; and
 * redlock.h's rl_engine_watch and the like. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "hashslot.h"
#include "substream.h"

/* a .. b .. c (b binary-safe), its length in *len; NULL when out of memory. */
static char *join(const char *a, size_t alen, const char *b, size_t blen, const char *c, size_t clen, size_t *len) {
    *len = alen + blen + clen;
    char *p = malloc(*len + 1);
    if (p == NULL) return NULL;
    memcpy(p, a, alen);
    if (blen) memcpy(p + alen, b, blen);
    if (clen) memcpy(p + alen + blen, c, clen);
    p[*len] = '\0';
    return p;
}

/* What a message says if it is a release's: on a resource's channel the
 * clients that listened, a positive decimal number (no sign, no leading
 * zero, at most 9 digits); on a wake channel "1", which says 1. 0: it is
 * not a release's message. */
static int release_says(const char *p, size_t len, int wake) {
    if (p == NULL || len == 0 || len > 9 || p[0] == '0') return 0;
    if (wake) return len == 1 && p[0] == '1';
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

void rl_subs_message(rl_subs *s, const char *ch, size_t len, const char *payload, size_t plen, int sharded) {
    int id = rl_names_find(sharded ? &s->by_shard_channel : &s->by_channel, ch, len);
    if (id < 0) return;
    rl_watched *w = &s->w[id];
    int wake = sharded ? w->cwake_len == len && memcmp(w->cwake, ch, len) == 0
                       : w->wake_len == len && memcmp(w->wake, ch, len) == 0;
    int says = release_says(payload, plen, wake);
    if (says == 0) return;
    if (w->waiters == 0) {
        /* lingering: a node gave this engine a turn that nobody here
         * waits for; unsubscribing (at once) lets it pass the turn on */
        if (wake) w->linger_until = s->linger_next = RL_LINGER_OVER;
        return;
    }
    w->heard++;
    s->total++;
    s->heard_total++;
    w->listeners = says;
    if (w->news == 0) s->news[s->nnews++] = id;
    w->news |= wake ? 1 : 3;
}

/* Take watch id's names out of the index (those that are in it). */
static void unindex_watch(rl_subs *s, int id) {
    rl_watched *w = &s->w[id];
    rl_names_remove(&s->by_resource, w->channel + s->head_len, w->len - s->head_len, id);
    rl_names_remove(&s->by_channel, w->channel, w->len, id);
    rl_names_remove(&s->by_channel, w->wake, w->wake_len, id);
    if (w->cchannel) rl_names_remove(&s->by_shard_channel, w->cchannel, w->clen, id);
    if (w->cwake) rl_names_remove(&s->by_shard_channel, w->cwake, w->cwake_len, id);
}

/* The id of resource's watch (lingering or not), or -1 (always for a name
 * no key could hold). */
static int find(const rl_subs *s, const char *resource, size_t len) {
    if (resource == NULL || len == 0 || len > RL_MAX_KEY_LEN) return -1;
    return rl_names_find(&s->by_resource, resource, len);
}

/* Index live watch id by its resource and its channel names (0), or
 * index nothing of it (-1, out of memory). */
static int index_watch(rl_subs *s, int id) {
    rl_watched *w = &s->w[id];
    int failed = rl_names_add(&s->by_resource, w->channel + s->head_len, w->len - s->head_len, id) != 0 ||
                 rl_names_add(&s->by_channel, w->channel, w->len, id) != 0 ||
                 rl_names_add(&s->by_channel, w->wake, w->wake_len, id) != 0 ||
                 (w->cchannel && rl_names_add(&s->by_shard_channel, w->cchannel, w->clen, id) != 0) ||
                 (w->cwake && rl_names_add(&s->by_shard_channel, w->cwake, w->cwake_len, id) != 0);
    if (!failed) return 0;
    unindex_watch(s, id);
    return -1;
}

/* A free slot (made if need be), or -1 when out of memory. */
static int free_slot(rl_subs *s) {
    for (int id = 0; id < s->nw; id++)
        if (!rl_watched_live(&s->w[id])) return id;
    if (s->nw == s->capw) {
        int cap = s->capw ? s->capw * 2 : 8;
        rl_watched *w = realloc(s->w, (size_t)cap * sizeof(*w));
        if (w == NULL) return -1;
        s->w = w;
        int *news = realloc(s->news, (size_t)cap * sizeof(*news));
        if (news == NULL) return -1;
        s->news = news;
        s->capw = cap;
    }
    memset(&s->w[s->nw], 0, sizeof(s->w[0]));
    return s->nw++;
}

/* w's names on cluster nodes (its key's companion base: hashslot.h) and
 * its key's hash slot; wake: the wake channel's head. 0, or -1 when out of
 * memory. */
static int cluster_names(rl_watched *w, const char *wake, size_t wlen) {
    const char *key = w->channel + strlen(RL_CHANNEL_PREFIX);
    size_t klen = w->len - strlen(RL_CHANNEL_PREFIX);
    rl_buf base = {0};
    if (rl_cluster_base(&base, key, klen) != 0) return -1;
    w->hslot = rl_hash_slot(key, klen);
    w->cchannel = join(RL_CHANNEL_PREFIX, strlen(RL_CHANNEL_PREFIX), base.data, base.len, "", 0, &w->clen);
    w->cwake = join(wake, wlen, base.data, base.len, "", 0, &w->cwake_len);
    rl_buf_free(&base);
    return w->cchannel && w->cwake ? 0 : -1;
}

int rl_subs_watch(rl_subs *s, const char *resource, size_t len, const char *waiter, double now_ms) {
    if (resource == NULL || len == 0 || len > RL_MAX_KEY_LEN - s->opts->prefix_len) return -1;
    int id = find(s, resource, len);
    if (id >= 0) {
        s->w[id].waiters++;
        s->w[id].linger_until = 0; /* lingering: still subscribed */
        return id;
    }
    id = free_slot(s);
    if (id < 0) return -1;
    char wake[sizeof(RL_WAKE_PREFIX) + RL_WAITER_ID_LEN + 2];
    int wlen = snprintf(wake, sizeof(wake), "%s%.*s:", RL_WAKE_PREFIX, RL_WAITER_ID_LEN, waiter);
    rl_watched *w = &s->w[id];
    w->channel = join(s->head, s->head_len, resource, len, "", 0, &w->len);
    w->wake = join(wake, (size_t)wlen, s->opts->prefix, s->opts->prefix_len, resource, len, &w->wake_len);
    w->hslot = -1;
    if (w->channel == NULL || w->wake == NULL || (s->clusters && cluster_names(w, wake, (size_t)wlen) != 0) ||
        index_watch(s, id) != 0) {
        free(w->channel);
        free(w->wake);
        free(w->cchannel);
        free(w->cwake);
        memset(w, 0, sizeof(*w));
        return -1;
    }
    w->waiters = 1;
    s->used++;
    if (w->len > s->longest) s->longest = w->len;
    if (w->wake_len > s->longest) s->longest = w->wake_len;
    if (w->cwake_len > s->longest) s->longest = w->cwake_len;
    if (w->clen > s->longest) s->longest = w->clen;
    rl_subs_changed(s, w, 1, now_ms);
    return id;
}

/* Forget watch id's news (it has no waiter now). */
static void drop_news(rl_subs *s, int id) {
    rl_watched *w = &s->w[id];
    for (int k = 0; w->news && k < s->nnews; k++)
        if (s->news[k] == id) {
            s->news[k] = s->news[--s->nnews];
            break;
        }
    w->news = 0;
}

/* Unsubscribe watch id (its last waiter gone, its linger over) and free its slot. */
static void end_watch(rl_subs *s, int id, double now_ms) {
    rl_watched *w = &s->w[id];
    w->linger_until = 0;
    s->used--;
    rl_subs_changed(s, w, 0, now_ms);
    drop_news(s, id);
    unindex_watch(s, id);
    free(w->channel);
    free(w->wake);
    free(w->cchannel);
    free(w->cwake);
    memset(w, 0, sizeof(*w));
}

void rl_subs_unwatch(rl_subs *s, const char *resource, size_t len, double now_ms, int linger_ms) {
    int id = find(s, resource, len);
    if (id < 0 || s->w[id].waiters == 0 || --s->w[id].waiters > 0) return;
    if (linger_ms <= 0) {
        end_watch(s, id, now_ms);
        return;
    }
    rl_watched *w = &s->w[id];
    drop_news(s, id);
    w->linger_until = now_ms + linger_ms; /* > 0: the engine's clock starts at 0 and never goes back */
    if (s->linger_next == 0 || w->linger_until < s->linger_next) s->linger_next = w->linger_until;
}

void rl_subs_linger_advance(rl_subs *s, double now_ms) {
    if (s->linger_next == 0 || now_ms < s->linger_next) return;
    s->linger_next = 0;
    for (int id = 0; id < s->nw; id++) {
        rl_watched *w = &s->w[id];
        if (w->waiters > 0 || w->linger_until == 0) continue;
        if (w->linger_until <= now_ms) {
            end_watch(s, id, now_ms);
        } else if (s->linger_next == 0 || w->linger_until < s->linger_next) {
            s->linger_next = w->linger_until;
        }
    }
}

unsigned rl_subs_heard(const rl_subs *s, const char *resource, size_t len) {
    if (resource == NULL) return s->total;
    int id = find(s, resource, len);
    return id >= 0 ? s->w[id].heard : 0;
}

int rl_subs_listeners(const rl_subs *s, const char *resource, size_t len) {
    if (resource != NULL) {
        int id = find(s, resource, len);
        return id >= 0 ? s->w[id].listeners : 0;
    }
    int most = 0;
    for (int id = 0; id < s->nw; id++)
        if (s->w[id].waiters > 0 && s->w[id].listeners > most) most = s->w[id].listeners;
    return most;
}

int rl_subs_news(rl_subs *s, int *broadcast) {
    if (s->nnews == 0) return -1;
    int id = s->news[--s->nnews];
    if (broadcast) *broadcast = (s->w[id].news & 2) != 0;
    s->w[id].news = 0;
    return id;
}

/* ---- redlock.h's rl_engine_watch and the like ---- */

int rl_engine_watch(rl_engine *e, const char *resource, size_t len, double now_ms) {
    rl_subs *s = rl_engine_subs(e, &now_ms);
    if (rl_engine_check_name(e, resource, len) != 0) return RL_ERR;
    int id = rl_subs_watch(s, resource, len, rl_engine_waiter_id(e), now_ms);
    if (id < 0) return rl_engine_fail(e, "out of memory"), RL_ERR;
    return id;
}

void rl_engine_unwatch(rl_engine *e, const char *resource, size_t len, double now_ms) {
    rl_subs *s = rl_engine_subs(e, &now_ms);
    rl_subs_unwatch(s, resource, len, now_ms, 0);
}

void rl_engine_unwatch_won(rl_engine *e, const char *resource, size_t len, double now_ms) {
    rl_subs *s = rl_engine_subs(e, &now_ms);
    rl_subs_unwatch(s, resource, len, now_ms, RL_WATCH_LINGER_MS);
}

unsigned rl_engine_heard(const rl_engine *e, const char *resource, size_t len) {
    return rl_subs_heard(rl_engine_subs(e, NULL), resource, len);
}

int rl_engine_heard_listeners(const rl_engine *e, const char *resource, size_t len) {
    return rl_subs_listeners(rl_engine_subs(e, NULL), resource, len);
}

int rl_engine_heard_next(rl_engine *e, int *broadcast) {
    return rl_subs_news(rl_engine_subs(e, NULL), broadcast);
}

int rl_engine_listening(const rl_engine *e) {
    return rl_subs_listening(rl_engine_subs(e, NULL));
}
