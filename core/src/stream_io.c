/* stream_io.c — one node's command stream (see stream.h): its output and
 * its replies.
 *
 * Commands are appended to one output buffer that the driver writes from,
 * so everything queued between two writes goes out in one write and a
 * command costs no allocation; the reply FIFO is the ticket ring. hiredis'
 * reader parses the replies (reply.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream_impl.h"

/* ---- the ticket ring ---- */

rl_ticket rl_stream_ring_pop(rl_stream *s) {
    rl_ticket t = s->ring[s->ring_head];
    s->ring_head = (s->ring_head + 1) % s->ring_cap;
    s->ring_count--;
    return t;
}

/* Make room for extra more tickets. */
int rl_stream_ring_reserve(rl_stream *s, unsigned extra) {
    if (s->ring_count + extra <= s->ring_cap) return 0;
    unsigned cap = s->ring_cap ? s->ring_cap : 64;
    while (cap < s->ring_count + extra) cap *= 2;
    rl_ticket *ring = malloc(cap * sizeof(*ring));
    if (!ring) return -1;
    for (unsigned i = 0; i < s->ring_count; i++) ring[i] = s->ring[(s->ring_head + i) % s->ring_cap];
    free(s->ring);
    s->ring = ring;
    s->ring_cap = cap;
    s->ring_head = 0;
    return 0;
}

static int ring_push(rl_stream *s, rl_ticket t) {
    if (rl_stream_ring_reserve(s, 1) != 0) return -1;
    s->ring[(s->ring_head + s->ring_count) % s->ring_cap] = t;
    s->ring_count++;
    return 0;
}

/* ---- writing ---- */

/* Where the bytes that may go out now end: until the setup has succeeded,
 * only the setup commands may. */
static size_t writable_end(const rl_stream *s) {
    return s->holding ? s->hold_at : s->out.len;
}

size_t rl_stream_output(const rl_stream *s, const char **data) {
    if (s->state != RL_STREAM_UP) return 0;
    *data = s->out.data + s->out_off;
    return writable_end(s) - s->out_off;
}

void rl_stream_wrote(rl_stream *s, size_t n, double now_ms) {
    (void)now_ms;
    size_t room = writable_end(s) - s->out_off;
    if (s->state != RL_STREAM_UP || n > room) n = room;
    s->out_off += n;
    s->written_total += (long long)n;
    if (s->out_off == s->out.len) s->out.len = s->out_off = s->hold_at = 0;
    if (s->redo_queued && s->written_total >= s->redo_end) {
        /* the releases kept are written: forget them */
        size_t bytes = 0;
        for (unsigned i = 0; i < s->redo_queued; i++) bytes += s->redo_lens[i];
        memmove(s->redo.data, s->redo.data + bytes, s->redo.len - bytes);
        s->redo.len -= bytes;
        memmove(s->redo_lens, s->redo_lens + s->redo_queued, (s->redo_count - s->redo_queued) * sizeof(*s->redo_lens));
        s->redo_count -= s->redo_queued;
        s->redo_queued = 0;
    }
}

/* The stall watchdog looks every stall_reset/2 while commands are unanswered. */
void rl_stream_arm_watchdog(rl_stream *s, double now_ms) {
    if (s->state == RL_STREAM_UP && s->ring_count > 0 && s->watch_at_ms == 0)
        s->watch_at_ms = now_ms + s->opts->stall_reset_ms / 2.0;
}

/* ---- commands kept: lists of commands back to back ---- */

/* Room in *lens (of *cap) for one more length after count. 0, or -1. */
static int lens_reserve(size_t **lens, unsigned *cap, unsigned count) {
    if (count < *cap) return 0;
    unsigned n = *cap ? *cap * 2 : 8;
    size_t *grown = realloc(*lens, n * sizeof(*grown));
    if (!grown) return -1;
    *lens = grown;
    *cap = n;
    return 0;
}

/* The copy of the i-th release awaiting its reply: where it starts. */
static size_t resend_at(const rl_stream *s, unsigned i) {
    size_t off = s->resend_off;
    for (unsigned k = 0; k < i; k++) off += s->resend_lens[s->resend_first + k];
    return off;
}

/* Keep a copy of a release (a ticket with resend) queued on this
 * connection until it is answered: 0, or -1 if out of memory or past
 * RL_REDO_MAX bytes (it then goes out once, and is not kept). The copies
 * answered are dropped from the front lazily: moved out once they are at
 * least as many as those still kept. */
static int resend_push(rl_stream *s, const char *cmd, size_t len) {
    if (s->resend_first > 0 && s->resend_first >= s->resend_count) {
        memmove(s->resends.data, s->resends.data + s->resend_off, s->resends.len - s->resend_off);
        s->resends.len -= s->resend_off;
        memmove(s->resend_lens, s->resend_lens + s->resend_first, s->resend_count * sizeof(*s->resend_lens));
        s->resend_off = 0;
        s->resend_first = 0;
    }
    if (s->resends.len - s->resend_off + len > RL_REDO_MAX || rl_buf_reserve(&s->resends, len) != 0 ||
        lens_reserve(&s->resend_lens, &s->resend_cap, s->resend_first + s->resend_count) != 0)
        return -1;
    memcpy(s->resends.data + s->resends.len, cmd, len);
    s->resends.len += len;
    s->resend_lens[s->resend_first + s->resend_count++] = len;
    return 0;
}

/* Forget the copy of the i-th release awaiting its reply (it was answered,
 * or taken back unsent). */
static void resend_forget(rl_stream *s, unsigned i) {
    size_t len = s->resend_lens[s->resend_first + i];
    if (i == 0) {
        s->resend_off += len;
        s->resend_first++;
    } else {
        size_t off = resend_at(s, i);
        unsigned k = s->resend_first + i;
        memmove(s->resends.data + off, s->resends.data + off + len, s->resends.len - off - len);
        s->resends.len -= len;
        memmove(s->resend_lens + k, s->resend_lens + k + 1, (s->resend_count - i - 1) * sizeof(*s->resend_lens));
    }
    if (--s->resend_count == 0) s->resends.len = s->resend_off = s->resend_first = 0;
}

void rl_stream_keep_resends(rl_stream *s, unsigned from, double now_ms) {
    if (from >= s->resend_count) return;
    size_t at = resend_at(s, from), off = at;
    for (unsigned k = from; k < s->resend_count; k++) {
        size_t len = s->resend_lens[s->resend_first + k];
        /* past RL_REDO_MAX or out of memory, the key stays until its ttl */
        (void)rl_stream_redo(s, s->resends.data + off, len, now_ms);
        off += len;
    }
    s->resends.len = at;
    s->resend_count = from;
    if (from == 0) s->resends.len = s->resend_off = s->resend_first = 0;
}

/* Append a command and its ticket, both or neither. */
int rl_stream_queue(rl_stream *s, const char *cmd, size_t len, rl_ticket t, double now_ms) {
    t.end = s->queued_total + (long long)len;
    if (rl_buf_reserve(&s->out, len) != 0 || rl_stream_ring_reserve(s, 1) != 0) {
        snprintf(s->errstr, sizeof(s->errstr), "out of memory");
        return -1;
    }
    if (t.resend && resend_push(s, cmd, len) != 0) t.resend = 0;
    (void)ring_push(s, t); /* room was made */
    memcpy(s->out.data + s->out.len, cmd, len);
    s->out.len += len;
    s->queued_total += (long long)len;
    rl_stream_arm_watchdog(s, now_ms);
    return 0;
}

/* Commands wholly unwritten are moved up over those taken back, in one
 * pass: the output's bytes from position p are at out_off + (p -
 * written_total), and a command starts where the one before it ends. */
void rl_stream_withdraw(rl_stream *s, int (*take)(void *owner, int node, rl_ticket t), void *owner) {
    long long start = s->ring_start, removed = 0, redo_removed = 0;
    unsigned kept = 0, resend = 0; /* resend: the copy of the next ticket with resend */
    for (unsigned i = 0; i < s->ring_count; i++) {
        rl_ticket t = s->ring[(s->ring_head + i) % s->ring_cap];
        long long end = t.end, len = end - start;
        if (t.kind > 0 && start >= s->written_total && take(owner, s->index, t)) {
            removed += len;
            if (s->redo_queued && end <= s->redo_end) redo_removed += len;
            if (t.resend) resend_forget(s, resend);
        } else {
            if (t.resend) resend++;
            if (removed > 0 && start >= s->written_total) {
                size_t from = s->out_off + (size_t)(start - s->written_total);
                memmove(s->out.data + from - removed, s->out.data + from, (size_t)len);
            }
            t.end -= removed;
            s->ring[(s->ring_head + kept++) % s->ring_cap] = t;
        }
        start = end;
    }
    s->ring_count = kept;
    s->out.len -= (size_t)removed;
    s->queued_total -= removed;
    s->redo_end -= redo_removed;
    if (s->out_off == s->out.len) s->out.len = s->out_off = s->hold_at = 0;
}

/* Room for both is made first, so the second cannot fail once the first
 * is queued. */
int rl_stream_send_pair(rl_stream *s, const char *cmd, size_t len, rl_ticket ticket, const char *cmd2, size_t len2,
                        rl_ticket ticket2, double now_ms) {
    if (rl_buf_reserve(&s->out, len + len2) != 0 || rl_stream_ring_reserve(s, 2) != 0) {
        snprintf(s->errstr, sizeof(s->errstr), "out of memory");
        return -1;
    }
    if (rl_stream_send(s, cmd, len, ticket, now_ms) != 0) return -1;
    return rl_stream_queue(s, cmd2, len2, ticket2, now_ms);
}

/* Queue the releases kept (rl_stream_redo) not yet queued on this
 * connection, which is up and set up: a suspect node's too, behind what
 * was queued before them, so that they run when it runs again, whether or
 * not anyone drives the client then. */
void rl_stream_flush_redo(rl_stream *s, double now_ms) {
    if (s->state != RL_STREAM_UP || s->holding || s->redo_queued == s->redo_count) return;
    size_t off = 0;
    for (unsigned i = 0; i < s->redo_count; i++) {
        if (i >= s->redo_queued) {
            rl_ticket t = {-1, 0, REDO, now_ms, 0, 0, 0, 0, 0, 0, 0};
            if (rl_stream_queue(s, s->redo.data + off, s->redo_lens[i], t, now_ms) != 0) break;
            s->redo_queued = i + 1;
            s->redo_end = s->queued_total;
        }
        off += s->redo_lens[i];
    }
}

int rl_stream_redo(rl_stream *s, const char *cmd, size_t len, double now_ms) {
    if (s->redo.len + len > RL_REDO_MAX || rl_buf_reserve(&s->redo, len) != 0) return -1;
    if (lens_reserve(&s->redo_lens, &s->redo_cap, s->redo_count) != 0) return -1;
    memcpy(s->redo.data + s->redo.len, cmd, len);
    s->redo.len += len;
    s->redo_lens[s->redo_count++] = len;
    s->redo_kept_ms = now_ms;
    if (s->state == RL_STREAM_IDLE) rl_stream_open(s, now_ms);
    rl_stream_flush_redo(s, now_ms);
    return 0;
}

void rl_stream_expire_redo(rl_stream *s, double kept_ms, double now_ms) {
    if (kept_ms <= 0 || s->redo_count == s->redo_queued || now_ms - s->redo_kept_ms <= kept_ms) return;
    size_t queued = 0;
    for (unsigned i = 0; i < s->redo_queued; i++) queued += s->redo_lens[i];
    s->redo.len = queued;
    s->redo_count = s->redo_queued;
}

/* ---- reading ---- */

/* The nonce step check k of the connection asks for: "rl-step-", the
 * connection's number and k. Every check's differs, so a reply lost just
 * before a check shows when the next check is answered. */
static int step_nonce(const rl_stream *s, unsigned k, char *buf, size_t len) {
    return snprintf(buf, len, "rl-step-%u-%u", s->step_nonce, k);
}

/* The reply to a step check must be its own nonce: any other reply answers
 * some other command, so the replies are out of step with the commands. An
 * error proves nothing either way (a node may refuse ECHO, or answer errors
 * to everything: it fails its votes anyway); the next check will tell. */
static void step_reply(rl_stream *s, const rl_reply *reply, double now_ms) {
    char nonce[48];
    size_t len = (size_t)step_nonce(s, s->checks_queued - (unsigned)s->step_check, nonce, sizeof(nonce));
    s->step_check--;
    if (reply->type == RL_REPLY_ERROR) return;
    if (reply->type == RL_REPLY_STRING && reply->len == len && memcmp(reply->str, nonce, len) == 0) return;
    rl_stream_drop(s, RL_OUT_OF_STEP, 1, now_ms);
}

/* The peer that votes for server run_id now (connected, its setup done),
 * or -1. One that voted for it and is down or idle now does not count: the
 * server's voter is whichever of its nodes is set up first, so a node that
 * only claimed another's run_id (an impostor, a proxy passing INFO on)
 * holds that server's vote only while it stays connected. */
static int voter_of(const rl_stream *s, const char *run_id) {
    for (int j = 0; j < s->npeers; j++) {
        const rl_stream *p = &s->peers[j];
        if (j != s->index && p->state == RL_STREAM_UP && !p->holding && p->run_id[0] &&
            strcmp(p->run_id, run_id) == 0)
            return j;
    }
    return -1;
}

/* The peer that voted for server run_id last through a connection that
 * has ended since (whatever it is connected to now), and when that
 * connection ended (*until); or -1. */
static int former_voter_of(const rl_stream *s, const char *run_id, double *until) {
    int found = -1;
    for (int j = 0; j < s->npeers; j++) {
        if (j == s->index) continue;
        for (int k = 0; k < RL_ENDED_VOTES; k++) {
            const rl_ended_vote *v = &s->peers[j].voted[k];
            if (v->until_ms > 0 && strcmp(v->id, run_id) == 0 && (found < 0 || v->until_ms > *until)) {
                found = j;
                *until = v->until_ms;
            }
        }
    }
    return found;
}

/* The commands held behind the setup that rl_stream_withdraw takes back:
 * those queued by until (their rounds began by then). */
typedef struct held_before {
    double until;
    rl_ticket *taken;
    unsigned n, cap;
} held_before;

static int take_held_before(void *ctx, int node, rl_ticket t) {
    held_before *h = ctx;
    (void)node;
    if (t.sent_ms > h->until || h->n == h->cap) return 0;
    h->taken[h->n++] = t;
    return 1;
}

/* s takes over the vote for its server from node former + 1, whose
 * connection ended at until. A round that began before then may have had
 * that node's vote for the server already, and must not get a second one
 * through s: the commands held behind s's setup that were queued by then
 * fail, never having been sent. Return 0, or -1 when s was dropped (out of
 * memory). */
static int fail_votes_cast_before(rl_stream *s, int former, double until, double now_ms) {
    if (s->ring_count == 0) return 0;
    held_before h = {until, malloc(s->ring_count * sizeof(rl_ticket)), 0, s->ring_count};
    if (h.taken == NULL) {
        rl_stream_drop(s, "connection reset: out of memory", 1, now_ms);
        return -1;
    }
    rl_stream_withdraw(s, take_held_before, &h);
    char why[RL_NODE_ERR_LEN];
    snprintf(why, sizeof(why), "same server as node %d, which may have voted in this round", former + 1);
    for (unsigned i = 0; i < h.n; i++) {
        h.taken[i].unsent = 1;
        s->on_reply(s->owner, s->index, h.taken[i], NULL, why);
    }
    free(h.taken);
    return 0;
}

/* Every setup reply is in and none refused: the node votes for the server
 * INFO named, unless another node already does. Commands held back may go,
 * but for those a node that voted for the same server before may have had
 * its vote in. */
static void setup_done(rl_stream *s, double now_ms) {
    int other = s->seen_id[0] ? voter_of(s, s->seen_id) : -1;
    if (other >= 0) {
        snprintf(s->errstr, sizeof(s->errstr), "same server as node %d (run_id %s)", other + 1, s->seen_id);
        rl_stream_drop(s, s->errstr, 1, now_ms);
        return;
    }
    double until = 0;
    int former = s->seen_id[0] ? former_voter_of(s, s->seen_id, &until) : -1;
    if (former >= 0 && fail_votes_cast_before(s, former, until, now_ms) != 0) return;
    memcpy(s->run_id, s->seen_id, sizeof(s->run_id));
    s->backoff_ms = s->opts->reconnect_min_ms;
    s->lost[0] = '\0';
    s->holding = 0;
    rl_stream_flush_redo(s, now_ms);
}

/* A reply to a step check, a script load, or AUTH, SELECT or INFO. A
 * refused AUTH or SELECT ends the connection, and every command held behind
 * it fails with the reason, never having been sent. INFO says which server
 * this is (a server that will not say is taken as it is). */
static void internal_reply(rl_stream *s, rl_ticket t, const rl_reply *reply, double now_ms) {
    if (t.kind == CHECK_ECHO) {
        step_reply(s, reply, now_ms);
        return;
    }
    if (t.kind == LOAD_SCRIPT) {
        s->scripts_loading = 0; /* a refusal only means EVALSHA falls back to EVAL */
        return;
    }
    if (t.kind == REDO) return; /* a release sent again: whatever it found */
    if (t.kind == SETUP_INFO) {
        memcpy(s->seen_id, reply->run_id, sizeof(s->seen_id));
    } else if (reply->type == RL_REPLY_ERROR && t.kind == SETUP_AUTH) {
        char said[sizeof(s->errstr)];
        rl_url_scrub(s->url, reply->str, said, sizeof(said));
        set_err(s, "AUTH refused: ", said);
        rl_stream_drop(s, s->errstr, 1, now_ms);
        return;
    } else if (reply->type == RL_REPLY_ERROR) {
        set_err(s, "SELECT refused: ", reply->str);
        rl_stream_drop(s, s->errstr, 1, now_ms);
        return;
    }
    if (--s->setup_left == 0) setup_done(s, now_ms);
}

int rl_stream_feed(rl_stream *s, const char *data, size_t len, double now_ms) {
    if (s->state != RL_STREAM_UP) return -1;
    unsigned conn = s->conn;
    s->read_ms = now_ms;
    if (s->suspect && len > 0) {
        /* it answers again: it votes again */
        s->suspect = 0;
        rl_skipped_clear(&s->skipped);
    }
    if (rl_reader_feed(&s->reader, data, len) != 0) {
        rl_stream_drop(s, "connection lost: out of memory", 1, now_ms);
        return -1;
    }
    /* Hand every complete reply to its ticket, until the connection ends. */
    while (s->conn == conn) {
        const rl_reply *reply;
        int got = rl_reader_next(&s->reader, &reply);
        if (got == 0) break;
        if (got < 0) {
            set_err(s, "connection reset: ", rl_reader_error(&s->reader));
            rl_stream_drop(s, s->errstr, 1, now_ms);
        } else if (s->ring_count == 0) {
            rl_stream_drop(s, "connection reset: a reply to no command", 1, now_ms);
        } else {
            rl_ticket t = rl_stream_ring_pop(s);
            s->ring_start = t.end;
            s->answered_ms = now_ms;
            if (t.resend) resend_forget(s, 0); /* answered: its copy is not needed */
            if (t.kind > 0) s->on_reply(s->owner, s->index, t, reply, NULL);
            else internal_reply(s, t, reply, now_ms);
        }
    }
    return s->conn == conn ? 0 : -1;
}

void rl_stream_unsent(rl_stream *s, long long bytes) {
    if (s->state == RL_STREAM_UP && bytes >= 0) s->unsent = bytes;
}

/* ---- the rest of the interface ---- */

/* Bytes wait that may be written now. */
static int has_output(const rl_stream *s) {
    return s->state == RL_STREAM_UP && writable_end(s) > s->out_off;
}

int rl_stream_take_wants(rl_stream *s, double now_ms) {
    int w = s->wants;
    s->wants = 0;
    /* A driver may take the ask long after it was made (the nginx hub's
     * timer runs once the worker gets back to its event loop): the connect
     * is not judged on the time before it began. */
    if ((w & RL_WANT_CONNECT) && s->state == RL_STREAM_CONNECTING &&
        now_ms + s->opts->connect_timeout_ms > s->connect_by_ms)
        s->connect_by_ms = now_ms + s->opts->connect_timeout_ms;
    if (has_output(s)) w |= RL_WANT_WRITE;
    return w;
}

int rl_stream_wanting(const rl_stream *s) {
    return s->wants != 0 || has_output(s);
}

/* Queue step check number checks_queued (see rl_stream_check_step). */
void rl_stream_queue_check(rl_stream *s, double now_ms) {
    if (!connected_or_connecting(s) || in_setup(s)) return;
    char nonce[48], cmd[80];
    int nlen = step_nonce(s, s->checks_queued, nonce, sizeof(nonce));
    int len = snprintf(cmd, sizeof(cmd), "*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n", nlen, nonce);
    rl_ticket t = {-1, 0, CHECK_ECHO, now_ms, 0, 0, 0, 0, 0, 0, 0};
    if (rl_stream_queue(s, cmd, (size_t)len, t, now_ms) != 0) return;
    s->checks_queued++;
    s->step_check++;
    s->counts.step_checks++;
    s->check_ms = now_ms;
}

void rl_stream_check_step(rl_stream *s, double now_ms) {
    if (!s->step_check) rl_stream_queue_check(s, now_ms);
}

int rl_stream_suspect(const rl_stream *s) {
    return s->suspect && connected_or_connecting(s);
}

int rl_stream_suspect_text(const rl_stream *s, double now_ms, char *buf, size_t len) {
    if (!rl_stream_suspect(s)) return 0;
    if (rl_stream_setup_text(s, now_ms, buf, len)) return 1;
    double quiet = now_ms - s->silent_ms;
    snprintf(buf, len, "not answering for %.0f ms (suspect: only a probe goes to it)", quiet > 0 ? quiet : 0);
    return 1;
}

int rl_stream_unwritten(const rl_stream *s) {
    int queued = (s->state == RL_STREAM_CONNECTING || s->state == RL_STREAM_UP) && s->out.len > s->out_off;
    return s->redo_count > 0 || queued;
}

int rl_stream_unanswered(const rl_stream *s) {
    if (s->state != RL_STREAM_UP || s->holding || s->suspect || s->ring_count == 0) return 0;
    /* bytes still come, but none has ended a reply since the oldest one
     * owed was sent (or the last reply, if later) for stall_reset_ms */
    double since = s->ring[s->ring_head].sent_ms > s->answered_ms ? s->ring[s->ring_head].sent_ms : s->answered_ms;
    return s->read_ms - since < s->opts->stall_reset_ms;
}

double rl_stream_held_since(const rl_stream *s) {
    int waiting = s->state == RL_STREAM_CONNECTING ? s->out.len > 0
                                                   : s->state == RL_STREAM_UP && s->holding && s->hold_at < s->out.len;
    return waiting ? s->setup_ms : 0;
}

rl_mark rl_stream_mark(const rl_stream *s) {
    rl_mark m = {s->conn, s->queued_total};
    return m;
}

int rl_stream_passed(const rl_stream *s, rl_mark m) {
    return s->conn != m.conn || s->written_total >= m.end || s->written_total >= s->queued_total;
}
