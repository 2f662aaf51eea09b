/* resp.h — the pieces that command.c and command_slots.c write commands
 * with: RESP headers, bulk strings and decimal numbers, each written at p
 * (room reserved by the caller) and returning the byte after it. Internal. */
#ifndef RL_RESP_H
#define RL_RESP_H

#include <stddef.h>
#include <string.h>

#define LIT(s) s, sizeof(s) - 1
#define SHA_LEN 40
#define HEADER_MAX 24 /* "$" + 20 digits + CRLF, rounded up */

/* Script text around a number: STR(RL_QUEUE_MAX) is "1024". */
#define STR_(x) #x
#define STR(x) STR_(x)

/* n bytes of s. */
static inline char *put(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

/* v in decimal; 20 digits hold any 64-bit value. */
static inline char *put_uint(char *p, unsigned long long v) {
    char digits[20];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n > 0) *p++ = digits[--n];
    return p;
}

/* kind (one of *, $) then n, CRLF. */
static inline char *put_header(char *p, char kind, size_t n) {
    *p++ = kind;
    p = put_uint(p, n);
    return put(p, LIT("\r\n"));
}

/* s as a bulk string. */
static inline char *put_bulk(char *p, const char *s, size_t n) {
    p = put_header(p, '$', n);
    p = put(p, s, n);
    return put(p, LIT("\r\n"));
}

/* A number >= 0 (a ttl, a count, a slot) as a bulk string. */
static inline char *put_ttl(char *p, int ttl_ms) {
    char digits[HEADER_MAX];
    size_t n = (size_t)(put_uint(digits, (size_t)ttl_ms) - digits);
    return put_bulk(p, digits, n);
}

#endif
