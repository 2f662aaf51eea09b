/* tls.c — TLS sessions for the libev driver over OpenSSL (see tls.h).
 *
 * OpenSSL reads and writes the socket through a BIO of our own (tls_bio.c),
 * which never raises SIGPIPE. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tls.h"
#include "tls_bio.h"

struct rl_tls {
    SSL_CTX *ctx;
    char *server_name;       /* replaces the URL's host for SNI and verification (NULL: none) */
    int verify;
    int has_cert;            /* a client certificate is configured */
};

/* ---- error text ---- */

/* The reason text of OpenSSL's latest error (never NULL). */
static const char *last_reason(unsigned long code) {
    const char *r = code ? ERR_reason_error_string(code) : NULL;
    return r ? r : "unknown error";
}

/* The last error queued by the failed call; the queue is emptied. */
static unsigned long take_error(void) {
    unsigned long code = 0, e;
    while ((e = ERR_get_error()) != 0) code = e;
    return code;
}

static int is_ip(const char *host) {
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* err = that the server may have refused our client certificate (or our
 * lack of one): it asked for one, sent nothing since, and then ended the
 * connection without a word (how: "reset" or "closed"). A hedge: a server
 * that only asks may end connections for other reasons. */
static void refusal(rl_tls_session *s, const char *how, int during, char *err, size_t errlen) {
    snprintf(err, errlen, "server %s? (connection %s %s)",
             s->tls->has_cert ? "refused the client certificate" : "requires a client certificate", how,
             during ? "in the handshake" : "before any reply");
}

/* err = what the failed call rc on s means. during: in the handshake.
 * The client certificate is blamed on the server's word only (its alert);
 * a server that had asked for one and ends the connection before its first
 * reply gets it as a hedge (a reset or an EOF: its alert may have been lost
 * to the reset; a close_notify: the reason, then that it had asked). */
static void describe(rl_tls_session *s, int rc, int during, char *err, size_t errlen) {
    SSL *ssl = s->ssl;
    int saved = errno;
    int kind = SSL_get_error(ssl, rc);
    unsigned long code = take_error();
    int reason = ERR_GET_REASON(code);
    const char *pre = during ? "TLS handshake failed: " : "TLS: ";
    /* TLS 1.3: our side of the handshake ends before the server has checked
     * our certificate; its refusal (an alert, often lost to the reset that
     * follows) comes with the first read. */
    int may_refuse = s->cert_asked && !s->got_data;
    const char *ended = NULL; /* the server ended the connection without a word */
    if (kind == SSL_ERROR_SYSCALL && code == 0)
        ended = rc == 0 || saved == 0 ? "closed" : saved == ECONNRESET || saved == EPIPE ? "reset" : NULL;
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
    else if (reason == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        ended = "closed";
#endif
    if (kind == SSL_ERROR_ZERO_RETURN) {
        snprintf(err, errlen, "closed by the server (TLS close_notify)%s",
                 may_refuse ? "; it had asked for a client certificate" : "");
    } else if (ended && may_refuse) {
        refusal(s, ended, during, err, errlen);
    } else if (kind == SSL_ERROR_SYSCALL && code == 0) {
        if (rc == 0 || saved == 0) snprintf(err, errlen, "%sconnection closed by the server", pre);
        else snprintf(err, errlen, "%s%s", pre, strerror(saved));
    } else if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        long v = SSL_get_verify_result(ssl);
        if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH) {
            snprintf(err, errlen, "hostname mismatch: the server's certificate is not for %s", s->name);
        } else {
            snprintf(err, errlen, "certificate verify failed: %s", X509_verify_cert_error_string(v));
        }
    } else if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED ||
               (!s->tls->has_cert && s->cert_asked &&
                (reason == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE || reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE))) {
        /* (a handshake failure before the server asked for a certificate is
         * something else, such as no cipher in common: OpenSSL's reason) */
        snprintf(err, errlen, "server requires a client certificate");
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
    } else if (reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        snprintf(err, errlen, "%sconnection closed by the server", pre);
#endif
    } else {
        snprintf(err, errlen, "%s%s", pre, last_reason(code));
    }
    s->failed = 1;
}

/* ---- the context ---- */

/* The server asks for a client certificate (called whether or not one is
 * configured: without one, an empty certificate is sent, as the server may
 * not insist): remember it, to explain a refusal. */
static int server_asks_cert(SSL *ssl, void *arg) {
    (void)arg;
    rl_tls_session *s = SSL_get_app_data(ssl);
    if (s) s->cert_asked = 1;
    return 1;
}

#ifndef ERR_SYSTEM_ERROR /* OpenSSL 1.1 */
#define ERR_SYSTEM_ERROR(e) (ERR_GET_LIB(e) == ERR_LIB_SYS)
#endif

/* OpenSSL asks for a passphrase (an encrypted key): there is nobody to
 * ask, and its default would read the terminal. No passphrase; *asked (if
 * arg is set) says it was wanted. */
static int no_passphrase(char *buf, int size, int rwflag, void *arg) {
    (void)buf;
    (void)size;
    (void)rwflag;
    if (arg) *(int *)arg = 1;
    return 0;
}

/* err = "tls.<option> '<path>': <why>". */
static void file_error(char *err, size_t errlen, const char *option, const char *path, const char *why) {
    if (err) snprintf(err, errlen, "tls.%s '%s': %s", option, path, why);
}

/* Check path before OpenSSL reads it, for a plain reason: it exists, it is
 * a regular file (dir: a directory), and it can be opened. Return 0, or -1
 * with err saying what is wrong. A device or a pipe is refused: OpenSSL
 * would read /dev/zero forever. */
static int check_file(const char *option, const char *path, int dir, char *err, size_t errlen) {
    struct stat st;
    const char *why = NULL;
    int fd = -1;
    if (stat(path, &st) != 0) why = strerror(errno);
    else if (dir && !S_ISDIR(st.st_mode)) why = "not a directory";
    else if (!dir && S_ISDIR(st.st_mode)) why = "is a directory";
    else if (!dir && !S_ISREG(st.st_mode)) why = "not a regular file";
    else if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) why = strerror(errno);
    if (fd >= 0) close(fd);
    if (why == NULL) return 0;
    file_error(err, errlen, option, path, why);
    return -1;
}

/* err = why OpenSSL could not load path (option's file), from its error
 * queue, which is emptied: the first error queued is the cause, the ones
 * after it only say which call failed ("PEM lib", "system lib"). missing:
 * what the file lacked when OpenSSL found nothing it could use in it. */
static void load_error(char *err, size_t errlen, const char *option, const char *path, const char *missing) {
    unsigned long first = 0, e;
    while ((e = ERR_get_error()) != 0)
        if (first == 0) first = e;
    char why[200];
    int lib = ERR_GET_LIB(first), reason = ERR_GET_REASON(first);
    if (first == 0) {
        snprintf(why, sizeof(why), "%s", missing); /* failed without saying why: it found nothing */
    } else if (ERR_SYSTEM_ERROR(first)) {
        snprintf(why, sizeof(why), "%s", strerror(reason));
    } else if ((lib == ERR_LIB_PEM && reason == PEM_R_NO_START_LINE) ||
               (lib == ERR_LIB_X509 && reason == X509_R_NO_CERTIFICATE_OR_CRL_FOUND) ||
#ifdef ERR_LIB_OSSL_DECODER
               (lib == ERR_LIB_OSSL_DECODER && reason == ERR_R_UNSUPPORTED) ||
#endif
               0) {
        snprintf(why, sizeof(why), "%s", missing);
    } else {
        const char *from = ERR_lib_error_string(first);
        snprintf(why, sizeof(why), "%s%s%s%s", last_reason(first), from ? " (" : "", from ? from : "", from ? ")" : "");
    }
    file_error(err, errlen, option, path, why);
}

rl_tls *rl_tls_new(const rl_tls_options *o, char *err, size_t errlen) {
    BIO_METHOD *bio_method = rl_tls_bio_method();
    rl_tls *t = calloc(1, sizeof(*t));
    ERR_clear_error();
    if (t == NULL || bio_method == NULL || (t->ctx = SSL_CTX_new(TLS_client_method())) == NULL) {
        if (err) snprintf(err, errlen, "TLS: cannot create a context: %s", last_reason(take_error()));
        free(t);
        return NULL;
    }
    SSL_CTX *ctx = t->ctx;
    t->verify = o->verify != 0;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* Writes offer the driver's output buffer, which may grow and move
     * between a write that must be retried and its retry. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* One recv for whatever has arrived, not two (header, body) per record;
     * what it read beyond one record waits in OpenSSL: rl_tls_pending. */
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_verify(ctx, t->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);

    if (o->keyfile && !o->certfile) {
        if (err) snprintf(err, errlen, "tls.keyfile needs tls.certfile");
        goto fail;
    }
    const char *key = o->keyfile ? o->keyfile : o->certfile;
    const char *key_option = o->keyfile ? "keyfile" : "certfile";
    if ((o->cafile && check_file("cafile", o->cafile, 0, err, errlen) != 0) ||
        (o->capath && check_file("capath", o->capath, 1, err, errlen) != 0) ||
        (o->certfile && check_file("certfile", o->certfile, 0, err, errlen) != 0) ||
        (o->keyfile && check_file("keyfile", o->keyfile, 0, err, errlen) != 0))
        goto fail;
    if (o->cafile && SSL_CTX_load_verify_locations(ctx, o->cafile, NULL) != 1) {
        load_error(err, errlen, "cafile", o->cafile, "no certificate in it");
        goto fail;
    }
    if (o->capath && SSL_CTX_load_verify_locations(ctx, NULL, o->capath) != 1) {
        load_error(err, errlen, "capath", o->capath, "no certificates found");
        goto fail;
    }
    if (!o->cafile && !o->capath && t->verify && SSL_CTX_set_default_verify_paths(ctx) != 1) {
        load_error(err, errlen, "cafile", X509_get_default_cert_file(), "cannot load the system's CAs");
        goto fail;
    }
    if (o->certfile) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->certfile) != 1) {
            load_error(err, errlen, "certfile", o->certfile, "no certificate in it");
            goto fail;
        }
        int asked = 0;
        SSL_CTX_set_default_passwd_cb_userdata(ctx, &asked);
        int used = SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM);
        SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
        if (used != 1) {
            if (asked) {
                take_error();
                file_error(err, errlen, key_option, key, "the key is encrypted (a passphrase cannot be given)");
            } else if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
                take_error();
                file_error(err, errlen, key_option, key, "the key does not match tls.certfile");
            } else {
                load_error(err, errlen, key_option, key,
                           o->keyfile ? "no private key in it" : "no private key in it (and no tls.keyfile)");
            }
            goto fail;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            take_error();
            file_error(err, errlen, key_option, key, "the key does not match tls.certfile");
            goto fail;
        }
        t->has_cert = 1;
    }
    SSL_CTX_set_cert_cb(ctx, server_asks_cert, NULL);
    if (o->server_name) {
        if (o->server_name[0] == '\0') {
            if (err) snprintf(err, errlen, "tls.server_name: empty");
            goto fail;
        }
        if (strlen(o->server_name) > TLSEXT_MAXLEN_host_name) { /* no handshake could send it */
            if (err) snprintf(err, errlen, "tls.server_name: longer than %d bytes", TLSEXT_MAXLEN_host_name);
            goto fail;
        }
        t->server_name = strdup(o->server_name);
        if (t->server_name == NULL) {
            if (err) snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    return t;
fail:
    rl_tls_free(t);
    return NULL;
}

void rl_tls_free(rl_tls *t) {
    if (t == NULL) return;
    SSL_CTX_free(t->ctx);
    free(t->server_name);
    free(t);
}

int rl_tls_check(const rl_tls_options *tls, char *err, size_t errlen) {
    rl_tls *t = rl_tls_new(tls, err, errlen);
    if (t == NULL) return RL_ERR;
    rl_tls_free(t);
    return RL_OK;
}

/* ---- sessions ---- */

int rl_tls_start(rl_tls *t, rl_tls_session *s, int fd, const char *host, char *err, size_t errlen) {
    rl_tls_end(s);
    ERR_clear_error();
    SSL *ssl = SSL_new(t->ctx);
    BIO *bio = ssl ? BIO_new(rl_tls_bio_method()) : NULL;
    if (bio == NULL) {
        snprintf(err, errlen, "TLS: cannot start a session: %s", last_reason(take_error()));
        SSL_free(ssl);
        return -1;
    }
    BIO_set_data(bio, (void *)(intptr_t)fd);
    SSL_set_bio(ssl, bio, bio);
    const char *name = t->server_name ? t->server_name : host;
    int ip = is_ip(name);
    int ok = 1;
    if (!ip) ok = SSL_set_tlsext_host_name(ssl, name) == 1;
    if (ok && t->verify) {
        if (ip) {
            ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
        } else {
            /* the subject alternative names only: no fallback to the CN of
             * a certificate without DNS names (as browsers do) */
            SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
            ok = SSL_set1_host(ssl, name) == 1;
        }
    }
    if (!ok) {
        snprintf(err, errlen, "TLS: cannot use the server name '%s': %s", name, last_reason(take_error()));
        SSL_free(ssl);
        return -1;
    }
    SSL_set_connect_state(ssl);
    *s = (rl_tls_session){.ssl = ssl, .tls = t};
    snprintf(s->name, sizeof(s->name), "%s", name); /* as given: an IPv6 address not expanded */
    SSL_set_app_data(ssl, s); /* s stays where it is while the session lives */
    return 0;
}

/* After a call that did not finish: RL_TLS_AGAIN with want set, or 0 if the
 * failure is something else. */
static int again(rl_tls_session *s, int rc) {
    switch (SSL_get_error(s->ssl, rc)) {
    case SSL_ERROR_WANT_READ: s->want = RL_TLS_WANT_READ; return 1;
    case SSL_ERROR_WANT_WRITE: s->want = RL_TLS_WANT_WRITE; return 1;
    default: return 0;
    }
}

int rl_tls_handshake(rl_tls_session *s, char *err, size_t errlen) {
    ERR_clear_error();
    errno = 0;
    int rc = SSL_do_handshake(s->ssl);
    if (rc == 1) {
        s->done = 1;
        s->want = 0;
        return 1;
    }
    if (again(s, rc)) return RL_TLS_AGAIN;
    describe(s, rc, 1, err, errlen);
    return RL_TLS_FAIL;
}

ssize_t rl_tls_read(rl_tls_session *s, char *buf, size_t len, char *err, size_t errlen) {
    ERR_clear_error();
    errno = 0;
    int n = len > INT32_MAX ? INT32_MAX : (int)len;
    int rc = SSL_read(s->ssl, buf, n);
    if (rc > 0) {
        s->got_data = 1;
        return rc;
    }
    if (again(s, rc)) return RL_TLS_AGAIN;
    describe(s, rc, 0, err, errlen);
    return RL_TLS_FAIL;
}

size_t rl_tls_pending(const rl_tls_session *s) {
    if (s->ssl == NULL) return 0;
    int n = SSL_pending(s->ssl);
    return n > 0 ? (size_t)n : (size_t)SSL_has_pending(s->ssl);
}

ssize_t rl_tls_write(rl_tls_session *s, const char *data, size_t len, char *err, size_t errlen) {
    ERR_clear_error();
    errno = 0;
    int n = len > INT32_MAX ? INT32_MAX : (int)len;
    int rc = SSL_write(s->ssl, data, n);
    if (rc > 0) return rc;
    if (again(s, rc)) return RL_TLS_AGAIN;
    describe(s, rc, 0, err, errlen);
    return RL_TLS_FAIL;
}

void rl_tls_end(rl_tls_session *s) {
    if (s->ssl == NULL) return;
    if (s->done && !s->failed) {
        ERR_clear_error();
        SSL_shutdown(s->ssl); /* queues close_notify; never waits for the peer's */
        ERR_clear_error();
    }
    SSL_free(s->ssl);
    *s = (rl_tls_session){0};
}
