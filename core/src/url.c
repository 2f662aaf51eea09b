/* url.c — parsing node URLs and telling when two name one server. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "redlock.h"
#include "url.h"

#define fail(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* Longest URL an error text quotes, so that the reason after it always fits
 * a caller's RL_ERR_LEN buffer behind a "server N: " prefix. */
#define SHOWN_MAX 96

/* 1 if text begins with a URL's scheme and "://" (a list split at the
 * wrong character: "host:1;redis://host:2" shows the mistake). */
static int scheme_at(const char *text) {
    if (!isalpha((unsigned char)*text)) return 0;
    size_t n = 1 + strspn(text + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");
    return strncmp(text + n, "://", 3) == 0;
}

/* Write into out (size cap >= SHOWN_MAX + 4) text as error texts quote it:
 * the password (what sits between the user's ':' and the last '@', or the
 * whole userinfo when it has no ':') replaced by "***", and cut to SHOWN_MAX
 * bytes with "..." after. Unix socket URLs carry no password. */
static void shown_url(const char *text, char *out, size_t cap) {
    char tmp[SHOWN_MAX * 2 + 8];
    const char *scheme_end = strstr(text, "://");
    const char *start = scheme_end ? scheme_end + 3 : text;
    const char *at = strncmp(text, "unix://", 7) == 0 ? NULL : strrchr(start, '@');
    if (at) {
        const char *colon = memchr(start, ':', (size_t)(at - start));
        const char *keep_to = colon ? colon + 1 : start;
        snprintf(tmp, sizeof(tmp), "%.*s***%.*s", (int)(keep_to - text) > SHOWN_MAX ? SHOWN_MAX : (int)(keep_to - text),
                 text, SHOWN_MAX, at);
    } else {
        /* no '@': "[user]:REST" where REST is no port (digits, ending the
         * address, followed by '+' as in a cluster's list, or by ';' or '|'
         * and another URL: a list split at the wrong character) is a password
         * cut from its host (a list split inside it: "user:top,secret@h"):
         * not shown. ("host:63790x" is hidden too: a port mistyped is
         * named by the reason after the URL.) */
        const char *colon = NULL;
        if (scheme_end && strncmp(text, "unix://", 7) != 0) {
            size_t authority = strcspn(start, "/?#");
            const char *host_end = start;
            if (*start == '[') {
                const char *bracket = memchr(start, ']', authority);
                host_end = bracket ? bracket + 1 : start + authority;
            }
            colon = memchr(host_end, ':', authority - (size_t)(host_end - start));
        }
        size_t rest = colon ? strcspn(colon + 1, "/?#") : 0;
        size_t digits = colon ? strspn(colon + 1, "0123456789") : 0;
        int port = digits > 0 && (digits == rest || colon[1 + digits] == '+' ||
                                  ((colon[1 + digits] == ';' || colon[1 + digits] == '|') &&
                                   scheme_at(colon + 2 + digits)));
        if (colon && rest > 0 && !port)
            snprintf(tmp, sizeof(tmp), "%.*s***%.*s", (int)(colon + 1 - text) > SHOWN_MAX ? SHOWN_MAX : (int)(colon + 1 - text),
                     text, SHOWN_MAX, colon + 1 + rest);
        else
            snprintf(tmp, sizeof(tmp), "%.*s", SHOWN_MAX + 1, text);
    }
    if (strlen(tmp) > SHOWN_MAX) snprintf(out, cap, "%.*s...", SHOWN_MAX - 3, tmp);
    else snprintf(out, cap, "%s", tmp);
}

/* Copy text[0..len) into dst (size cap), decoding %XX escapes. -1 if it does not fit or an escape is bad. */
static int copy_decoded(char *dst, size_t cap, const char *text, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)text[i];
        if (c == '%') {
            if (i + 2 >= len || !isxdigit((unsigned char)text[i + 1]) || !isxdigit((unsigned char)text[i + 2]))
                return -1;
            char hex[3] = {text[i + 1], text[i + 2], 0};
            c = (int)strtol(hex, NULL, 16);
            i += 2;
        }
        if (o + 1 >= cap || c == 0) return -1;
        dst[o++] = (char)c;
    }
    dst[o] = '\0';
    return 0;
}

/* Parse a decimal integer in [lo, hi] spanning exactly text[0..len). */
static int parse_int(const char *text, size_t len, long lo, long hi, long *out) {
    if (len == 0 || len > 9) return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)text[i])) return -1;
        v = v * 10 + (text[i] - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* The query after a URL's '?': name=value pairs joined by '&', each name
 * once: replicas=N (0 to RL_MAX_REPLICAS) and, for a unix socket (with_db),
 * db=N. */
static int parse_query(const char *shown, const char *query, int with_db, rl_url *u, char *err, size_t errlen) {
    const char *p = query;
    int seen_db = 0;
    for (;;) {
        size_t len = strcspn(p, "&");
        long v;
        if (with_db && strncmp(p, "db=", 3) == 0 && !seen_db) {
            if (parse_int(p + 3, len - 3, 0, 1000000, &v) != 0) fail("'%s': db must be a number", shown);
            u->db = (int)v;
            seen_db = 1;
        } else if (strncmp(p, "replicas=", 9) == 0 && len >= 9 && u->replicas < 0) {
            if (parse_int(p + 9, len - 9, 0, RL_MAX_REPLICAS, &v) != 0)
                fail("'%s': replicas must be a number from 0 to %d", shown, RL_MAX_REPLICAS);
            u->replicas = (int)v;
        } else {
            fail("'%s': the query may say %sreplicas=N, each once", shown, with_db ? "db=N and " : "");
        }
        if (p[len] == '\0') return 0;
        p += len + 1;
    }
}

static int parse_unix(const char *shown, const char *rest, rl_url *u, char *err, size_t errlen) {
    const char *query = strchr(rest, '?');
    size_t plen = query ? (size_t)(query - rest) : strlen(rest);
    if (plen == 0 || rest[0] != '/') fail("'%s': a unix socket URL needs an absolute path (unix:///path/to.sock)", shown);
    if (plen >= sizeof(u->path)) fail("'%s': socket path too long", shown);
    memcpy(u->path, rest, plen);
    u->path[plen] = '\0';
    if (query && parse_query(shown, query + 1, 1, u, err, errlen) != 0) return -1;
    snprintf(u->name, sizeof(u->name), "unix://%s", u->path);
    if (u->db) snprintf(u->name + strlen(u->name), sizeof(u->name) - strlen(u->name), "?db=%d", u->db);
    return 0;
}

static int parse_tcp(const char *shown, const char *rest, rl_url *u, char *err, size_t errlen) {
    const char *end = rest + strcspn(rest, "/?#");
    const char *at = NULL;
    for (const char *p = rest; p < end; p++)
        if (*p == '@') at = p;
    const char *hostport = rest;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        size_t ulen = colon ? (size_t)(colon - rest) : (size_t)(at - rest);
        if (colon) {
            if (copy_decoded(u->user, sizeof(u->user), rest, ulen) != 0) fail("'%s': bad user name", shown);
            if (copy_decoded(u->password, sizeof(u->password), colon + 1, (size_t)(at - colon - 1)) != 0)
                fail("'%s': bad password", shown);
        } else {
            /* redis://secret@host: a lone userinfo is the password, as other
             * clients read it (decoded straight into the password's room). */
            if (copy_decoded(u->password, sizeof(u->password), rest, ulen) != 0) fail("'%s': bad password", shown);
            u->user[0] = '\0';
        }
        hostport = at + 1;
    }
    const char *hend, *portp = NULL;
    const char *hstart = hostport;
    if (*hostport == '[') {
        const char *close = memchr(hostport, ']', (size_t)(end - hostport));
        if (!close) fail("'%s': unclosed '[' in host", shown);
        hstart = hostport + 1;
        hend = close;
        if (close + 1 < end) {
            if (close[1] != ':') fail("'%s': junk after ']'", shown);
            portp = close + 2;
        }
    } else {
        const char *colon = memchr(hostport, ':', (size_t)(end - hostport));
        hend = colon ? colon : end;
        if (colon) portp = colon + 1;
    }
    size_t hlen = (size_t)(hend - hstart);
    if (hlen == 0) fail("'%s': missing host", shown);
    if (hlen >= sizeof(u->host)) fail("'%s': host name too long", shown);
    memcpy(u->host, hstart, hlen);
    u->host[hlen] = '\0';
    u->port = 6379;
    if (portp) {
        long port;
        if (parse_int(portp, (size_t)(end - portp), 1, 65535, &port) != 0)
            fail("'%s': port must be a number from 1 to 65535", shown);
        u->port = (int)port;
    }
    const char *query = strchr(end, '?');
    if (*end == '/') {
        long db;
        const char *dbp = end + 1;
        size_t dblen = query ? (size_t)(query - dbp) : strlen(dbp);
        if (dblen > 0 && parse_int(dbp, dblen, 0, 1000000, &db) != 0) fail("'%s': database must be a number", shown);
        if (dblen > 0) u->db = (int)db;
    } else if (*end != '\0' && end != query) {
        fail("'%s': unexpected '%c' after host and port", shown, *end);
    }
    if (query && parse_query(shown, query + 1, 0, u, err, errlen) != 0) return -1;
    char address[sizeof(u->host) + 8];
    rl_url_address(u, address, sizeof(address));
    snprintf(u->name, sizeof(u->name), "%s://%s%s%s", u->tls ? "rediss" : "redis", u->user, u->user[0] ? "@" : "",
             address);
    if (u->db) snprintf(u->name + strlen(u->name), sizeof(u->name) - strlen(u->name), "/%d", u->db);
    return 0;
}

void rl_url_address(const rl_url *u, char *buf, size_t len) {
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(buf, len, "%s%s%s:%d", v6 ? "[" : "", u->host, v6 ? "]" : "", u->port);
}

int rl_url_parse(const char *text, rl_url *u, char *err, size_t errlen) {
    memset(u, 0, sizeof(*u));
    u->replicas = -1;
    if (text == NULL || *text == '\0') fail("empty server URL");
    char shown[SHOWN_MAX + 4];
    shown_url(text, shown, sizeof(shown));
    for (const char *p = text; *p; p++)
        if (isspace((unsigned char)*p)) fail("'%s': white space in server URL", shown);
    u->tls = strncmp(text, "rediss://", 9) == 0;
    if (u->tls || strncmp(text, "redis://", 8) == 0) {
        u->kind = RL_URL_TCP;
        return parse_tcp(shown, text + 8 + u->tls, u, err, errlen);
    }
    if (strncmp(text, "unix://", 7) == 0) {
        u->kind = RL_URL_UNIX;
        return parse_unix(shown, text + 7, u, err, errlen);
    }
    if (strstr(text, "://")) fail("'%s': unknown scheme (use redis://, rediss:// or unix://)", shown);
    fail("'%s': not a URL (expected redis://host:port or unix:///path)", shown);
}

static const char *canonical_host(const char *host) {
    return strcasecmp(host, "localhost") == 0 ? "127.0.0.1" : host;
}

int rl_url_same_server(const rl_url *a, const rl_url *b) {
    if (a->kind != b->kind) return 0;
    if (a->kind == RL_URL_UNIX) return strcmp(a->path, b->path) == 0;
    return a->port == b->port && strcasecmp(canonical_host(a->host), canonical_host(b->host)) == 0;
}

/* See url.h. */
void rl_url_scrub(const rl_url *u, const char *text, char *out, size_t cap) {
    if (cap == 0) return;
    size_t n = strlen(text);
    const char *args = strstr(text, ", with args beginning with:");
    if (args) n = (size_t)(args - text);
    size_t plen = strlen(u->password), o = 0;
    for (size_t i = 0; i < n && o + 1 < cap;) {
        if (plen > 0 && n - i >= plen && memcmp(text + i, u->password, plen) == 0) {
            for (const char *m = "***"; *m && o + 1 < cap; m++) out[o++] = *m;
            i += plen;
        } else {
            out[o++] = text[i++];
        }
    }
    out[o] = '\0';
}
