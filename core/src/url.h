/* url.h — node addresses: redis://[[user]:password@]host[:port][/db] (rediss:// for
 * TLS), unix:///path[?db=N]. */
#ifndef RL_URL_H
#define RL_URL_H

#include <stddef.h>

enum { RL_URL_TCP = 1, RL_URL_UNIX = 2 };

typedef struct rl_url {
    int kind;            /* RL_URL_TCP or RL_URL_UNIX */
    int tls;             /* TCP: 1 for rediss:// (the driver speaks TLS), else 0 */
    char host[256];      /* TCP: host name or address, brackets removed */
    char tls_name[256];  /* TCP, TLS: the name the server's certificate must be for (and the SNI)
                            when not host: a cluster master's announced hostname; "" for host */
    int port;            /* TCP: 1..65535 (default 6379) */
    char path[108];      /* UNIX: socket path */
    char user[128];      /* AUTH user ("" for password-only AUTH) */
    char password[256];  /* AUTH password ("" for no AUTH) */
    int db;              /* SELECT db (0: none sent) */
    int replicas;        /* ?replicas=N: the replicas this node's votes wait for (rl_options.replicas);
                            -1 when the URL does not say (the client's option holds) */
    char name[416];      /* the URL without its password, for messages */
} rl_url;

/* Parse text into *u. On error return -1 with the reason in err; *u is then
 * unspecified. */
int rl_url_parse(const char *text, rl_url *u, char *err, size_t errlen);

/* Write a TCP URL's "host:port" into buf (an IPv6 address in brackets). */
void rl_url_address(const rl_url *u, char *buf, size_t len);

/* Write into out (size cap) text, what a node said to u's AUTH, with u's
 * password nowhere in it: Redis repeats a command it does not know with its
 * arguments (a renamed AUTH: "ERR unknown command 'AUTH', with args
 * beginning with: 'user' 'secret'"), and that part is cut; any other
 * occurrence of the password becomes "***". */
void rl_url_scrub(const rl_url *u, const char *text, char *out, size_t cap);

/* Return 1 if a and b name the same server (whatever their db or password),
 * comparing hosts case-insensitively with "localhost" as 127.0.0.1. */
int rl_url_same_server(const rl_url *a, const rl_url *b);

#endif
