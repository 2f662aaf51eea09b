/* stream_impl.h — what the two halves of a node's command stream share:
 * stream.c (the connection's life: connecting, the setup of a fresh
 * connection, ending it, the watchdog) and stream_io.c (its output, the
 * ticket ring and the replies). Nothing else includes it. */
#ifndef RL_STREAM_IMPL_H
#define RL_STREAM_IMPL_H

#include "stream.h"
#include "text.h"

/* Stream-internal command kinds: the setup sent on a fresh connection, the
 * step check and the script loads. Their replies never reach on_reply. */
enum { SETUP_AUTH = -1, SETUP_SELECT = -2, SETUP_INFO = -3, CHECK_ECHO = -4, LOAD_SCRIPT = -5, REDO = -6 };

/* errstr = prefix .. text, cut to fit. */
static inline void set_err(rl_stream *s, const char *prefix, const char *text) {
    rl_text_join(s->errstr, sizeof(s->errstr), prefix, text);
}

static inline int connected_or_connecting(const rl_stream *s) {
    return s->state == RL_STREAM_UP || s->state == RL_STREAM_CONNECTING;
}

/* The connection is being made, or its TLS handshake or its setup
 * (AUTH/SELECT/INFO) is unanswered: nothing queued behind it has gone out. */
static inline int in_setup(const rl_stream *s) {
    return s->state == RL_STREAM_CONNECTING || (s->state == RL_STREAM_UP && s->holding);
}

/* stream.c */

/* The connection is gone: say why, answer every unanswered command with
 * that, and reconnect after the backoff. close_it: the driver still has the
 * socket and is asked to close it. */
void rl_stream_drop(rl_stream *s, const char *why, int close_it, double now_ms);

/* stream_io.c */

/* Take the oldest ticket off the ring (it has one). */
rl_ticket rl_stream_ring_pop(rl_stream *s);

/* Make room for extra more tickets: 0, or -1 when out of memory. */
int rl_stream_ring_reserve(rl_stream *s, unsigned extra);

/* Append a command and its ticket, both or neither: 0, or -1 when out of
 * memory (errstr says so). */
int rl_stream_queue(rl_stream *s, const char *cmd, size_t len, rl_ticket t, double now_ms);

/* Queue the releases kept (rl_stream_redo) not yet queued on this
 * connection, if it is up and set up. */
void rl_stream_flush_redo(rl_stream *s, double now_ms);

/* The releases of this connection awaiting their replies (tickets with
 * resend), from the from-th on, are kept for the next connection
 * (rl_stream_redo) and no longer awaited here: their connection ended, or
 * they were taken back unsent. */
void rl_stream_keep_resends(rl_stream *s, unsigned from, double now_ms);

/* The stall watchdog looks every stall_reset/2 while commands are
 * unanswered: arm it if it is not. */
void rl_stream_arm_watchdog(rl_stream *s, double now_ms);

/* Queue a step check (ECHO of the next nonce), even with others in flight:
 * a suspect node's probe. Nothing if s has no connection or its setup is
 * under way. */
void rl_stream_queue_check(rl_stream *s, double now_ms);

#endif
