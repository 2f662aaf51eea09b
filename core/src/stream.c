/* stream.c — one node's command stream (see stream.h): the connection's
 * life. Connecting, the setup put in front of what was queued on a fresh
 * connection (AUTH, SELECT, INFO, the script loads), ending a connection
 * and answering what it owed, the reconnect backoff, and what is due (the
 * connect deadline, the stall watchdog). The output, the ticket ring and
 * the replies are stream_io.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream_impl.h"

/* ---- ending a connection ---- */

int rl_backoff_next(int cur_ms, int max_ms) {
    return cur_ms > max_ms / 2 ? max_ms : cur_ms * 2;
}

static void schedule_reconnect(rl_stream *s, double now_ms) {
    s->state = RL_STREAM_DOWN;
    s->retry_at_ms = now_ms + s->backoff_ms;
    s->backoff_ms = rl_backoff_next(s->backoff_ms, s->opts->reconnect_max_ms);
}

/* Forget what was queued or half-read on the connection. */
static void clear_connection(rl_stream *s) {
    s->conn++;
    s->out.len = s->out_off = s->hold_at = 0;
    s->setup_left = s->holding = 0;
    s->queued_total = s->written_total = s->ring_start = 0;
    s->unsent = 0;
    s->step_check = 0;
    s->checks_queued = 0;
    s->scripts_loading = 0;
    s->step_nonce++;
    s->watch_at_ms = 0;
    s->redo_queued = 0; /* what was kept goes again on the next connection */
    rl_reader_free(&s->reader);
}

/* Answer every command of the connection that just ended with why; written:
 * how far its output had been written (a command not wholly written never
 * ran: its ticket says unsent). The releases among them go again on the
 * next connection, whether or not they ran: a compare-and-delete by a
 * value nobody else has is safe to run twice. A callback may send to this
 * stream again (and so ask for a new connection): answer only the oldest
 * ring_count tickets, this connection's. */
static void answer_all(rl_stream *s, const char *why, long long written, double now_ms) {
    char text[RL_NODE_ERR_LEN];
    snprintf(text, sizeof(text), "%s", why); /* s->errstr may say "connecting" once a release is kept */
    why = text;
    rl_stream_keep_resends(s, 0, now_ms);
    for (unsigned old = s->ring_count; old > 0; old--) {
        rl_ticket t = rl_stream_ring_pop(s);
        t.unsent = t.end > written;
        if (t.kind > 0) s->on_reply(s->owner, s->index, t, NULL, why);
    }
}

/* The connection ends: one that was set up voted for its server until now.
 * Recorded in that server's record, else in the oldest one. */
static void stop_voting(rl_stream *s, double now_ms) {
    if (s->state != RL_STREAM_UP || s->holding || !s->run_id[0]) return;
    rl_ended_vote *record = &s->voted[0];
    for (int k = 0; k < RL_ENDED_VOTES; k++) {
        rl_ended_vote *v = &s->voted[k];
        if (v->until_ms > 0 && strcmp(v->id, s->run_id) == 0) {
            record = v;
            break;
        }
        if (v->until_ms < record->until_ms) record = v;
    }
    memcpy(record->id, s->run_id, sizeof(record->id));
    record->until_ms = now_ms;
}

/* The connection is gone: say why, answer every unanswered command with
 * that, and reconnect after the backoff (or, idle, when a command needs
 * it). close_it: the driver still has the socket and is asked to close it. */
/* rl_stream_drop, idle or not as the caller says. Idle: the stream is as
 * if never connected, and the next command makes a connection at once, not
 * after the backoff (and none is made before one needs it: a server that
 * keeps closing them costs a connection per command). */
static void drop_as(rl_stream *s, const char *why, int close_it, int idle, double now_ms) {
    stop_voting(s, now_ms);
    if (why != s->errstr) snprintf(s->errstr, sizeof(s->errstr), "%s", why);
    memcpy(s->lost, s->errstr, sizeof(s->lost));
    if (close_it) s->wants |= RL_WANT_CLOSE;
    if (close_it) s->counts.resets++;
    else s->counts.lost++;
    s->wants &= ~RL_WANT_CONNECT;
    long long written = s->written_total;
    clear_connection(s);
    if (idle) {
        s->state = RL_STREAM_IDLE;
        s->idle_after_loss = 1;
    } else {
        schedule_reconnect(s, now_ms);
    }
    answer_all(s, s->errstr, written, now_ms);
    if (idle && s->redo_count > 0) rl_stream_open(s, now_ms); /* releases kept: they go now */
}

void rl_stream_drop(rl_stream *s, const char *why, int close_it, double now_ms) {
    /* idle: a connection ended by its other end with nothing it was sent
     * left unanswered (the server's idle timeout, CLIENT KILL, a proxy's):
     * the oldest command owed (the setup's first, on a fresh connection)
     * was never wholly written, nor anything after it */
    int idle = !close_it && s->state == RL_STREAM_UP &&
               (s->ring_count == 0 || s->ring[s->ring_head].end > s->written_total);
    drop_as(s, why, close_it, idle, now_ms);
}

void rl_stream_reset(rl_stream *s, const char *why, double now_ms) {
    if (connected_or_connecting(s)) rl_stream_drop(s, why, 1, now_ms);
}

void rl_stream_down(rl_stream *s, const char *why, double now_ms) {
    if (connected_or_connecting(s)) rl_stream_drop(s, why && *why ? why : "connection lost", 0, now_ms);
}

int rl_stream_unused(const rl_stream *s) {
    return s->state == RL_STREAM_CONNECTING && s->ring_count == 0;
}

void rl_stream_closed_unused(rl_stream *s, const char *why, double now_ms) {
    if (rl_stream_unused(s)) drop_as(s, why && *why ? why : "connection lost", 0, 1, now_ms);
}

/* When the connection's current step began: the connect (with its TLS
 * handshake) when it was asked for, then when the driver took the ask, the
 * setup when the driver reported it connected (it may take the ask and
 * report that late: neither step is judged on the time nobody drove the
 * engine). */
static int asked_only(const rl_stream *s);

static double setup_began(const rl_stream *s) {
    return s->connect_by_ms - s->opts->connect_timeout_ms;
}

int rl_stream_setup_text(const rl_stream *s, double now_ms, char *buf, size_t len) {
    if (!in_setup(s)) return 0;
    const char *what = s->state == RL_STREAM_UP ? "AUTH/SELECT/INFO unanswered"
                       : s->handshaking         ? "TLS handshake under way"
                                                : "still connecting";
    double since = now_ms - setup_began(s);
    int n = asked_only(s) ? snprintf(buf, len, "connect not begun yet: the driver has not run since it was asked for")
                          : snprintf(buf, len, "%s, %.0f of %d ms", what, since > 0 ? since : 0, s->opts->connect_timeout_ms);
    if (s->lost[0] && n >= 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, " (last: %s)", s->lost);
    return 1;
}

void rl_stream_withdraw_held(rl_stream *s, double now_ms) {
    char why[RL_NODE_ERR_LEN];
    if (!rl_stream_setup_text(s, now_ms, why, sizeof(why))) return;
    /* The held commands are the newest tickets: those that end after the
     * setup (position 0). Copied out first: answering them may queue more. */
    unsigned k = 0, resends = 0;
    while (k < s->ring_count && s->ring[(s->ring_head + s->ring_count - 1 - k) % s->ring_cap].end > 0) k++;
    if (k == 0) return;
    rl_ticket *held = malloc(k * sizeof(*held));
    if (held == NULL) {
        rl_stream_drop(s, "connection reset: out of memory", 1, now_ms);
        return;
    }
    for (unsigned i = 0; i < k; i++) {
        held[i] = s->ring[(s->ring_head + s->ring_count - k + i) % s->ring_cap];
        if (held[i].kind == CHECK_ECHO) s->step_check = 0;
        if (held[i].kind == LOAD_SCRIPT) s->scripts_loading = 0;
        if (held[i].resend) resends++;
    }
    s->ring_count -= k;
    /* the releases among them (the newest kept copies) go once the setup has succeeded */
    rl_stream_keep_resends(s, s->resend_count - resends, now_ms);
    s->out.len = s->hold_at; /* the setup's bytes, written or not, stay */
    if (s->out_off == s->out.len) s->out.len = s->out_off = s->hold_at = 0;
    s->queued_total = 0;
    for (unsigned i = 0; i < k; i++) {
        held[i].unsent = 1;
        if (held[i].kind > 0) s->on_reply(s->owner, s->index, held[i], NULL, why);
    }
    free(held);
}

int rl_stream_detach(rl_stream *s, double now_ms) {
    int clean = s->state == RL_STREAM_UP && !s->holding && s->ring_count == 0 && s->out_off == s->out.len;
    if (s->state == RL_STREAM_IDLE || s->state == RL_STREAM_DOWN) return 0;
    snprintf(s->errstr, sizeof(s->errstr), "%s", clean ? "connection detached" : "connection closed with replies outstanding");
    s->wants &= ~(RL_WANT_CONNECT | RL_WANT_CLOSE);
    long long written = s->written_total;
    stop_voting(s, now_ms);
    clear_connection(s);
    s->state = RL_STREAM_IDLE;
    answer_all(s, s->errstr, written, now_ms);
    return clean;
}

/* ---- the setup of a fresh connection ---- */

/* The scripts that go by SHA1 (EVALSHA): a lock's release and extension,
 * a semaphore's acquire and a slot's release. */
#define SHA_SCRIPTS 4

/* Append the SCRIPT LOADs of the scripts sent by SHA1 to cmd, and their
 * tickets to *t (n of them so far). Return 0, or -1 when out of memory. */
static int script_loads(rl_buf *cmd, rl_ticket *t, int *n, double now_ms) {
    const char *scripts[SHA_SCRIPTS] = {rl_release_script, rl_extend_script, rl_acquire_slot_script,
                                        rl_release_slot_script};
    for (int i = 0; i < SHA_SCRIPTS; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", scripts[i]};
        size_t lens[3] = {6, 4, strlen(scripts[i])};
        if (rl_cmd_append_argv(cmd, 3, argv, lens) != 0) return -1;
        t[(*n)++] = (rl_ticket){-1, 0, LOAD_SCRIPT, now_ms, 0, (long long)cmd->len, 0, 0, 0, 0, 0};
    }
    return 0;
}

/* Queue SCRIPT LOAD of the scripts sent by SHA1 (unless loads are in
 * flight), so EVALSHA finds them. A node that lost them (SCRIPT FLUSH, a
 * restart) answers NOSCRIPT; a round then falls back to EVAL, but a reply
 * that comes after its round is over has nobody to fall back for. */
void rl_stream_load_scripts(rl_stream *s, double now_ms) {
    if (!connected_or_connecting(s) || s->scripts_loading) return;
    rl_buf cmd = {0};
    rl_ticket t[SHA_SCRIPTS];
    int n = 0, rc = script_loads(&cmd, t, &n, now_ms);
    size_t start = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = rl_stream_queue(s, cmd.data + start, (size_t)t[i].end - start, t[i], now_ms);
        start = (size_t)t[i].end;
    }
    rl_buf_free(&cmd);
    if (rc == 0) s->scripts_loading = 1;
}

/* The setup of a fresh connection: AUTH and SELECT as the URL asks, INFO
 * server, then the script loads; cmd gets their bytes, t[] their tickets
 * (ends relative to cmd). Return the number of tickets, or -1 when out of
 * memory. */
static int build_setup(const rl_stream *s, rl_buf *cmd, rl_ticket t[3 + SHA_SCRIPTS], double now_ms) {
    int n = 0;
    int auth = rl_cmd_auth(cmd, s->url->user, s->url->password);
    if (auth < 0) return -1;
    if (auth) t[n++] = (rl_ticket){-1, 0, SETUP_AUTH, now_ms, 0, (long long)cmd->len, 0, 0, 0, 0, 0};
    if (s->url->db) {
        char db[16];
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, (size_t)snprintf(db, sizeof(db), "%d", s->url->db)};
        if (rl_cmd_append_argv(cmd, 2, argv, lens) != 0) return -1;
        t[n++] = (rl_ticket){-1, 0, SETUP_SELECT, now_ms, 0, (long long)cmd->len, 0, 0, 0, 0, 0};
    }
    const char *argv[2] = {"INFO", "server"};
    size_t lens[2] = {4, 6};
    if (rl_cmd_append_argv(cmd, 2, argv, lens) != 0) return -1;
    t[n++] = (rl_ticket){-1, 0, SETUP_INFO, now_ms, 0, (long long)cmd->len, 0, 0, 0, 0, 0};
    if (script_loads(cmd, t, &n, now_ms) != 0) return -1;
    return n;
}

/* Put the setup in front of what was queued while connecting: its bytes
 * first in the output, its tickets first in the ring. Positions count from
 * the first command after it, so what was queued keeps its ends. */
static int put_setup_first(rl_stream *s, double now_ms) {
    rl_buf cmd = {0};
    rl_ticket t[3 + SHA_SCRIPTS];
    int n = build_setup(s, &cmd, t, now_ms);
    if (n < 0 || rl_buf_reserve(&s->out, cmd.len) != 0 || rl_stream_ring_reserve(s, (unsigned)n) != 0) {
        rl_buf_free(&cmd);
        return -1;
    }
    memmove(s->out.data + cmd.len, s->out.data, s->out.len);
    memcpy(s->out.data, cmd.data, cmd.len);
    s->out.len += cmd.len;
    s->hold_at = cmd.len;
    s->written_total = s->ring_start = -(long long)cmd.len;
    for (int i = n - 1; i >= 0; i--) {
        t[i].end -= (long long)cmd.len;
        s->ring_head = (s->ring_head + s->ring_cap - 1) % s->ring_cap;
        s->ring[s->ring_head] = t[i];
        s->ring_count++;
    }
    s->setup_left = n - SHA_SCRIPTS; /* the script loads are not setup: nothing waits for them */
    s->holding = 1;
    s->scripts_loading = 1;
    s->seen_id[0] = '\0';
    rl_buf_free(&cmd);
    return 0;
}

/* ---- connecting ---- */

void rl_stream_open(rl_stream *s, double now_ms) {
    if (connected_or_connecting(s)) return;
    s->counts.connects++;
    if (s->state == RL_STREAM_DOWN || s->idle_after_loss) s->counts.reconnects++;
    s->idle_after_loss = 0;
    s->state = RL_STREAM_CONNECTING;
    s->handshaking = 0;
    s->setup_ms = now_ms;
    s->connect_by_ms = now_ms + s->opts->connect_timeout_ms;
    s->wants |= RL_WANT_CONNECT;
    snprintf(s->errstr, sizeof(s->errstr), "connecting");
}

int rl_stream_connected(rl_stream *s, int fresh, double now_ms) {
    if (s->state != RL_STREAM_CONNECTING) return -1;
    s->wants &= ~RL_WANT_CONNECT;
    if (rl_reader_reset(&s->reader) != 0 || (fresh && put_setup_first(s, now_ms) != 0)) {
        rl_stream_drop(s, "connect failed: out of memory", 1, now_ms);
        return 0;
    }
    s->state = RL_STREAM_UP;
    /* The setup gets a connect timeout of its own, from now: the connect
     * may have finished long ago while nobody drove the engine. */
    if (fresh) s->connect_by_ms = now_ms + s->opts->connect_timeout_ms;
    s->read_ms = s->acked_ms = s->answered_ms = now_ms;
    s->acked = s->written_total;
    s->head_end = -1;
    s->errstr[0] = '\0';
    rl_stream_arm_watchdog(s, now_ms);
    rl_stream_flush_redo(s, now_ms); /* a pooled connection, set up already */
    return 0;
}

int rl_stream_send(rl_stream *s, const char *cmd, size_t len, rl_ticket ticket, double now_ms) {
    if (s->state == RL_STREAM_IDLE || (s->state == RL_STREAM_DOWN && now_ms >= s->retry_at_ms))
        rl_stream_open(s, now_ms);
    if (s->state == RL_STREAM_DOWN) return -1;
    if (rl_stream_suspect_text(s, now_ms, s->errstr, sizeof(s->errstr))) return -1;
    return rl_stream_queue(s, cmd, len, ticket, now_ms);
}

/* ---- what is due ---- */

/* Since when the node has owed a reply and sent nothing: the later of its
 * last bytes and the sending of the oldest command it has not answered. */
static double silent_since(const rl_stream *s) {
    double sent = s->ring_count ? s->ring[s->ring_head].sent_ms : s->read_ms;
    return sent > s->read_ms ? sent : s->read_ms;
}

/* The node stops answering: it gets no new commands until it does (see
 * rl_stream_suspect), only its probe; silent_ms: since when. */
static void become_suspect(rl_stream *s, double silent_ms, double now_ms) {
    s->suspect = 1;
    s->counts.suspected++;
    s->silent_ms = silent_ms;
    s->probe_every_ms = s->opts->stall_reset_ms / 2;
    s->probe_at_ms = now_ms + s->probe_every_ms;
    if (in_setup(s)) rl_stream_withdraw_held(s, now_ms); /* nothing waits behind its setup */
    else rl_stream_check_step(s, now_ms);                 /* the probe, unless a check is in flight already */
}

/* A connect asked for that the driver has not taken yet (rl_stream_take_wants):
 * it has not begun, so it can neither time out nor make the node suspect. */
static int asked_only(const rl_stream *s) {
    return s->state == RL_STREAM_CONNECTING && (s->wants & RL_WANT_CONNECT);
}

/* When the node becomes suspect if it stays silent (0: not now):
 *   - a connection being made or set up: a node timeout after that step
 *     began, with no reply yet (the connection itself lives on until its
 *     connect deadline);
 *   - a step check in flight with nothing heard since: a node timeout
 *     after the check was queued or the node last sent bytes, whichever is
 *     later; but not while the oldest command it owes a reply is not
 *     wholly at its end yet (as far as the driver can tell): a node cannot
 *     answer what it has not received, and the watchdog judges a link that
 *     takes nothing. */
static double suspicion_due(const rl_stream *s) {
    if (s->suspect || asked_only(s)) return 0;
    if (in_setup(s)) return setup_began(s) + s->opts->node_timeout_ms;
    if (s->state != RL_STREAM_UP || !s->step_check || s->ring_count == 0) return 0;
    if (s->ring[s->ring_head].end > s->written_total - s->unsent) return 0;
    return (s->check_ms > s->read_ms ? s->check_ms : s->read_ms) + s->opts->node_timeout_ms;
}

/* Commands unanswered and the node not keeping up for stall_reset_ms. Only
 * a reply proves the node's process alive: its kernel takes our bytes
 * whether or not the process runs. So the oldest unanswered command is
 * judged by where its bytes are:
 *   - not all at the node yet (a large batch, a slow link): the connection
 *     is stalled only if the node's end has taken no bytes at all for
 *     stall_reset_ms, and is then reset;
 *   - all at the node: if no reply has come for stall_reset_ms since, the
 *     node has stopped answering (a stopped process, or a reply lost on the
 *     way). It becomes suspect, and keeps its connection: a stopped process
 *     answers what waits for it once it runs again, and a lost reply shows
 *     when the probe is answered (its nonce pairs with the wrong command).
 *     A suspect node gets another probe stall_reset_ms / 2 later, and then
 *     at doubling intervals up to reconnect_max_ms: a probe's answer shows
 *     a reply lost before it, and a later probe gets through where earlier
 *     ones were lost on the way (a link that dropped what it carried), while
 *     a stopped node gets about one small command a second.
 * The driver feeds what has arrived before it advances the stream, so a
 * reply that is there is never mistaken for silence. */
static void watchdog_look(rl_stream *s, double now_ms) {
    s->watch_at_ms = 0;
    if (s->state != RL_STREAM_UP || s->ring_count == 0) return;
    rl_stream_arm_watchdog(s, now_ms);
    long long acked = s->written_total - s->unsent;
    if (acked > s->acked) s->acked = acked, s->acked_ms = now_ms;
    const rl_ticket *head = &s->ring[s->ring_head];
    double since;
    if (head->end > s->acked) {
        since = head->sent_ms > s->acked_ms ? head->sent_ms : s->acked_ms;
        if (now_ms - since < s->opts->stall_reset_ms) return;
        snprintf(s->errstr, sizeof(s->errstr), "connection reset: no bytes taken for %d ms", s->opts->stall_reset_ms);
        rl_stream_drop(s, s->errstr, 1, now_ms);
        return;
    }
    if (s->head_end != head->end) s->head_end = head->end, s->head_ms = now_ms;
    since = s->head_ms > s->read_ms ? s->head_ms : s->read_ms;
    if (s->suspect) {
        if (now_ms < s->probe_at_ms) return;
        rl_stream_queue_check(s, now_ms);
        s->probe_every_ms = rl_backoff_next(s->probe_every_ms, s->opts->reconnect_max_ms);
        s->probe_at_ms = now_ms + s->probe_every_ms;
    } else if (now_ms - since >= s->opts->stall_reset_ms) {
        become_suspect(s, silent_since(s), now_ms);
    }
}

/* The earliest of two moments, either of which may be 0 (none). */
static double earliest(double a, double b) {
    return a == 0 ? b : b == 0 || a < b ? a : b;
}

double rl_stream_deadline(const rl_stream *s) {
    switch (s->state) {
    case RL_STREAM_DOWN: return s->retry_at_ms;
    case RL_STREAM_CONNECTING: return earliest(asked_only(s) ? 0 : s->connect_by_ms, suspicion_due(s));
    case RL_STREAM_UP: return earliest(s->holding ? s->connect_by_ms : s->watch_at_ms, suspicion_due(s));
    default: return 0;
    }
}

void rl_stream_advance(rl_stream *s, double now_ms) {
    double due = rl_stream_deadline(s);
    if (due == 0 || now_ms < due) return;
    if (s->state == RL_STREAM_DOWN) {
        rl_stream_open(s, now_ms); /* reconnect in the background */
        return;
    }
    double suspicion = suspicion_due(s);
    if (suspicion != 0 && now_ms >= suspicion) become_suspect(s, in_setup(s) ? setup_began(s) : silent_since(s), now_ms);
    if (in_setup(s)) {
        if (now_ms < s->connect_by_ms || asked_only(s)) return;
        snprintf(s->errstr, sizeof(s->errstr), "%s timed out after %d ms",
                 s->state == RL_STREAM_UP ? "AUTH/SELECT/INFO" : s->handshaking ? "TLS handshake" : "connect",
                 s->opts->connect_timeout_ms);
        rl_stream_drop(s, s->errstr, 1, now_ms);
    } else if (s->watch_at_ms != 0 && now_ms >= s->watch_at_ms) {
        watchdog_look(s, now_ms);
    }
}

/* ---- the rest of the interface ---- */

void rl_stream_init(rl_stream *s, const rl_url *url, int index, const rl_options *opts,
                    rl_reply_fn on_reply, void *owner, rl_stream *peers, int npeers) {
    memset(s, 0, sizeof(*s));
    s->url = url;
    s->index = index;
    s->opts = opts;
    s->on_reply = on_reply;
    s->owner = owner;
    s->peers = peers;
    s->npeers = npeers;
    s->state = RL_STREAM_IDLE;
    s->backoff_ms = opts->reconnect_min_ms;
    snprintf(s->errstr, sizeof(s->errstr), "not connected");
}

void rl_stream_handshaking(rl_stream *s) {
    if (s->state == RL_STREAM_CONNECTING) s->handshaking = 1;
}

int rl_stream_restart(rl_stream *s, int index) {
    int had = connected_or_connecting(s) || (s->wants & RL_WANT_CLOSE);
    rl_stream was = *s;
    rl_stream_free(s);
    rl_stream_init(s, was.url, index, was.opts, was.on_reply, was.owner, was.peers, was.npeers);
    s->counts = was.counts;
    memcpy(s->voted, was.voted, sizeof(s->voted)); /* its ended connections' votes still count */
    s->conn = was.conn + 1; /* a mark taken on a connection before (rl_stream_passed) is of one gone */
    s->reader.keep_top = was.reader.keep_top;
    s->reader.max_string = was.reader.max_string;
    if (had) s->wants = RL_WANT_CLOSE;
    return had;
}

void rl_stream_free(rl_stream *s) {
    clear_connection(s);
    rl_skipped_clear(&s->skipped);
    free(s->ring);
    s->ring = NULL;
    s->ring_cap = s->ring_count = s->ring_head = 0;
    rl_buf_free(&s->out);
    rl_buf_free(&s->redo);
    free(s->redo_lens);
    s->redo_lens = NULL;
    s->redo_count = s->redo_cap = s->redo_queued = 0;
    rl_buf_free(&s->resends);
    free(s->resend_lens);
    s->resend_lens = NULL;
    s->resend_off = 0;
    s->resend_first = s->resend_count = s->resend_cap = 0;
}
