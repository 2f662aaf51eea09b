/* tls_bio.h — the socket BIO of tls.c's sessions (tls_bio.c). */
#ifndef RL_TLS_BIO_H
#define RL_TLS_BIO_H

#include <openssl/bio.h>

/* The process's one BIO method over a non-blocking socket (made on first
 * use, thread-safe, never freed), or NULL if OpenSSL could not make it.
 * BIO_set_data(bio, (void *)(intptr_t)fd) names the socket. */
BIO_METHOD *rl_tls_bio_method(void);

#endif
