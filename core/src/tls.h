/* tls.h — TLS for the libev driver's sockets (OpenSSL): one context per
 * client, built from rl_tls_options, and one session per connection with a
 * non-blocking handshake, read, write and shutdown. The session never
 * waits: when OpenSSL needs the socket readable or writable to go on, the
 * call returns RL_TLS_AGAIN and session->want says which (a read may need
 * the socket writable, a write may need it readable). Writes use send(2)
 * with MSG_NOSIGNAL, so a peer that went away never raises SIGPIPE. */
#ifndef RL_TLS_H
#define RL_TLS_H

#include <stddef.h>
#include <sys/types.h>

#include "redlock.h"

typedef struct rl_tls rl_tls;

enum { RL_TLS_AGAIN = 0, RL_TLS_FAIL = -1 };

/* What the session waits for after RL_TLS_AGAIN. */
enum { RL_TLS_WANT_READ = 1, RL_TLS_WANT_WRITE = 2 };

typedef struct rl_tls_session {
    void *ssl;               /* SSL *, NULL when there is no session */
    rl_tls *tls;             /* the context it was made from */
    int want;                /* RL_TLS_WANT_* after RL_TLS_AGAIN */
    int done;                /* the handshake finished */
    int failed;              /* a call failed: no close_notify at the end */
    int cert_asked;          /* the server asked for a client certificate */
    int got_data;            /* a read returned bytes: the server accepted the connection */
    char name[256];          /* the name the certificate must be for, as given (for messages) */
} rl_tls_session;

/* A context for o (CA, client certificate, verification). Each file is
 * checked (it exists, is a regular file or, for capath, a directory, and
 * opens) before OpenSSL loads it; an encrypted key is refused, never asked
 * a passphrase for. On error NULL, with the reason in err naming the
 * option and the file: "tls.keyfile '/x/y': No such file or directory",
 * "tls.cafile '/dev/zero': not a regular file", "tls.certfile '...': no
 * certificate in it", or OpenSSL's first queued reason; a server_name no
 * handshake can send: "tls.server_name: longer than 255 bytes". */
rl_tls *rl_tls_new(const rl_tls_options *o, char *err, size_t errlen);

/* Free the context. NULL is ignored. Sessions made from it must be gone. */
void rl_tls_free(rl_tls *t);

/* Begin a session on the connected non-blocking socket fd to host (the
 * name the server's certificate must be for: the URL's host, a name or an
 * IP literal, or the hostname a cluster master announces); the context's
 * server_name, when set, replaces it for SNI and verification. Return 0,
 * or -1 with the reason in err (out of memory). */
int rl_tls_start(rl_tls *t, rl_tls_session *s, int fd, const char *host, char *err, size_t errlen);

/* One step of the handshake: 1 when it is done, RL_TLS_AGAIN (see want),
 * or RL_TLS_FAIL with what went wrong in err ("certificate verify failed:
 * ...", "hostname mismatch: ...", "TLS handshake failed: ..."). */
int rl_tls_handshake(rl_tls_session *s, char *err, size_t errlen);

/* Read up to len bytes: the count, RL_TLS_AGAIN, or RL_TLS_FAIL with the
 * reason in err (the peer's close_notify included: "closed by the server
 * (TLS close_notify)"). */
ssize_t rl_tls_read(rl_tls_session *s, char *buf, size_t len, char *err, size_t errlen);

/* Nonzero when OpenSSL holds bytes read from the socket (decrypted or not)
 * that a read may return without the socket becoming readable again: read
 * on until RL_TLS_AGAIN then. */
size_t rl_tls_pending(const rl_tls_session *s);

/* Write up to len bytes of data (one TLS record at most): the count taken,
 * RL_TLS_AGAIN, or RL_TLS_FAIL with the reason in err. After RL_TLS_AGAIN
 * the next write must offer at least the same bytes again (it may offer
 * more; the buffer may have moved). */
ssize_t rl_tls_write(rl_tls_session *s, const char *data, size_t len, char *err, size_t errlen);

/* Send close_notify if it fits at once (never waits) and free the session.
 * The socket is the caller's to close. Safe on an empty session. */
void rl_tls_end(rl_tls_session *s);

#endif
