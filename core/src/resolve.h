/* resolve.h — a node's addresses, found without blocking the caller: numeric
 * addresses at once (AI_NUMERICHOST), host names by getaddrinfo on a detached
 * thread. The thread and its owner share a lookup; whichever lets go last
 * frees it, so an owner may walk away from a lookup still in progress. */
#ifndef RL_RESOLVE_H
#define RL_RESOLVE_H

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

#define RL_MAX_ADDRS 8  /* addresses kept per host name */

/* One address to connect to. */
typedef struct rl_addr {
    union {
        struct sockaddr any;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } sa;
    socklen_t len;
} rl_addr;

/* A host's addresses: IPv4 ones first, then IPv6 ones, each family in the
 * resolver's order. */
typedef struct rl_addrs {
    int n;
    rl_addr addr[RL_MAX_ADDRS];
} rl_addrs;

typedef struct rl_lookup rl_lookup;

/* If host is a numeric IPv4 or IPv6 address, fill *out with it and port and
 * return 0; nothing is looked up and no thread is started. Return -1 if host
 * is a name (*out is then empty). */
int rl_resolve_numeric(const char *host, int port, rl_addrs *out);

/* Start looking up host:port on a thread of its own. Return the lookup, or
 * NULL with the reason in err if it could not be started. The caller owns
 * one reference: give it back with rl_lookup_drop. */
rl_lookup *rl_lookup_start(const char *host, int port, char *err, size_t errlen);

/* Wait until the lookup has finished or the clock (rl_now_ms) passes
 * deadline_ms, whichever is first. Return 1 if it has finished, 0 if not. */
int rl_lookup_wait(rl_lookup *l, double deadline_ms);

/* Never waits. Return 0 while the lookup is running; 1 when it has found
 * addresses (now in *out); -1 when it has failed (the reason is in err). */
int rl_lookup_result(rl_lookup *l, rl_addrs *out, char *err, size_t errlen);

/* Give up the caller's reference. A lookup still running is freed by its
 * thread when getaddrinfo returns. NULL is ignored. */
void rl_lookup_drop(rl_lookup *l);

#endif
