/* test_reply.c — the reply reader fed byte streams, no network. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/reply.h"
#include "check.h"

static rl_reader rd;

/* Feed s in pieces of step bytes; return the number of complete replies. */
static int feed_in_steps(const char *s, size_t len, size_t step) {
    int got = 0;
    const rl_reply *r;
    for (size_t at = 0; at < len; at += step) {
        size_t n = len - at < step ? len - at : step;
        CHECK_INT(rl_reader_feed(&rd, s + at, n), 0);
        while (rl_reader_next(&rd, &r) == 1) got++;
    }
    return got;
}

static const rl_reply *next(void) {
    const rl_reply *r = NULL;
    CHECK_INT(rl_reader_next(&rd, &r), 1);
    return r;
}

static void parses_what_rounds_get(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char s[] = "+OK\r\n$-1\r\n:1\r\n:0\r\n-NOSCRIPT No matching script.\r\n";
    CHECK_INT(rl_reader_feed(&rd, s, sizeof(s) - 1), 0);
    const rl_reply *r = next();
    CHECK_INT(r->type, RL_REPLY_STATUS);
    CHECK_STR(r->str, "OK");
    CHECK_INT(r->len, 2);
    CHECK_INT(next()->type, RL_REPLY_NIL);
    r = next();
    CHECK_INT(r->type, RL_REPLY_INTEGER);
    CHECK_INT(r->integer, 1);
    CHECK_INT(next()->integer, 0);
    r = next();
    CHECK_INT(r->type, RL_REPLY_ERROR);
    CHECK_STR(r->str, "NOSCRIPT No matching script.");
    CHECK_INT(rl_reader_next(&rd, &r), 0); /* nothing more */
}

static void waits_for_replies_split_across_reads(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char s[] = "+OK\r\n$5\r\nhello\r\n:42\r\n*2\r\n$1\r\na\r\n*1\r\n:7\r\n-ERR x\r\n";
    for (size_t step = 1; step <= 7; step++) CHECK_INT(feed_in_steps(s, sizeof(s) - 1, step), 5);
}

static void keeps_arrays_as_one_reply_and_skips_their_elements(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char s[] = "*3\r\n$1\r\na\r\n*2\r\n:1\r\n+x\r\n$-1\r\n*0\r\n*-1\r\n+after\r\n";
    CHECK_INT(rl_reader_feed(&rd, s, sizeof(s) - 1), 0);
    const rl_reply *r = next();
    CHECK_INT(r->type, RL_REPLY_ARRAY);
    CHECK_INT(r->integer, 3);
    r = next();
    CHECK_INT(r->type, RL_REPLY_ARRAY);
    CHECK_INT(r->integer, 0);
    CHECK_INT(next()->type, RL_REPLY_NIL); /* a nil array */
    CHECK_STR(next()->str, "after");
}

static void cuts_long_texts_but_keeps_their_length(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    size_t n = 100000;
    char *s = malloc(n + 16);
    CHECK(s != NULL);
    s[0] = '-';
    memset(s + 1, 'e', n);
    memcpy(s + 1 + n, "\r\n", 2);
    CHECK_INT(rl_reader_feed(&rd, s, n + 3), 0);
    const rl_reply *r = next();
    CHECK_INT(r->type, RL_REPLY_ERROR);
    CHECK_INT(r->len, n);
    CHECK_INT(strlen(r->str), RL_REPLY_TEXT_LEN - 1);
    free(s);
}

static void reports_protocol_errors(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char s[] = "HTTP/1.1 400 Bad Request\r\n";
    const rl_reply *r;
    CHECK_INT(rl_reader_feed(&rd, s, sizeof(s) - 1), 0);
    CHECK_INT(rl_reader_next(&rd, &r), -1);
    CHECK(strstr(rl_reader_error(&rd), "rotocol") != NULL);
    /* a reset reader starts clean */
    CHECK_INT(rl_reader_reset(&rd), 0);
    CHECK_INT(rl_reader_feed(&rd, ":1\r\n", 4), 0);
    CHECK_INT(next()->integer, 1);
}

static void refuses_a_huge_declared_string_before_its_bytes(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char s[] = "$1073741824\r\nxxxx";
    const rl_reply *r;
    for (size_t i = 0; i < sizeof(s) - 1; i++) CHECK_INT(rl_reader_feed(&rd, s + i, 1), 0);
    CHECK_INT(rl_reader_next(&rd, &r), -1);
    CHECK(strstr(rl_reader_error(&rd), "reply too large: a string of 1073741824 bytes") != NULL);
    CHECK_INT(rl_reader_next(&rd, &r), -1); /* it stays refused */
    /* the largest allowed string still waits for its bytes */
    CHECK_INT(rl_reader_reset(&rd), 0);
    char head[32];
    snprintf(head, sizeof(head), "$%d\r\n", RL_REPLY_MAX_STRING);
    CHECK_INT(rl_reader_feed(&rd, head, strlen(head)), 0);
    CHECK_INT(rl_reader_next(&rd, &r), 0);
}

static void refuses_huge_arrays_and_endless_lines(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const rl_reply *r;
    CHECK_INT(rl_reader_feed(&rd, "*2000000000\r\n", 13), 0);
    CHECK_INT(rl_reader_next(&rd, &r), -1);
    CHECK(strstr(rl_reader_error(&rd), "an array of 2000000000 elements") != NULL);
    /* a nested one, too */
    CHECK_INT(rl_reader_reset(&rd), 0);
    CHECK_INT(rl_reader_feed(&rd, "*1\r\n*99999\r\n", 12), 0);
    CHECK_INT(rl_reader_next(&rd, &r), -1);
    /* a status line that never ends */
    CHECK_INT(rl_reader_reset(&rd), 0);
    char chunk[16384];
    memset(chunk, 'x', sizeof(chunk));
    chunk[0] = '+';
    int got = 0;
    for (int i = 0; i < 64 && got == 0; i++) {
        CHECK_INT(rl_reader_feed(&rd, chunk + (i ? 1 : 0), sizeof(chunk) - (i ? 1 : 0)), 0);
        got = rl_reader_next(&rd, &r);
    }
    CHECK_INT(got, -1);
    CHECK(strstr(rl_reader_error(&rd), "without CRLF") != NULL);
}

/* Arrays of arrays, each within RL_REPLY_MAX_ELEMENTS, sent without end
 * (a hostile node): refused once the reply holds more than
 * RL_REPLY_MAX_NESTED elements in all, not read for ever. A reply of that
 * many elements is still taken, and the count starts over with the next. */
static void refuses_endless_nested_arrays(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const rl_reply *r;
    CHECK_INT(rl_reader_feed(&rd, "*1000\r\n", 7), 0);
    int rc = 0, rounds = 0;
    while (rc == 0 && rounds < 100) {
        CHECK_INT(rl_reader_feed(&rd, "*1000\r\n", 7), 0);
        for (int i = 0; i < 1000; i++) CHECK_INT(rl_reader_feed(&rd, ":1\r\n", 4), 0);
        rc = rl_reader_next(&rd, &r);
        rounds++;
    }
    CHECK_INT(rc, -1);
    CHECK(rounds <= 5);
    CHECK(strstr(rl_reader_error(&rd), "more than 4096 elements in all") != NULL);
    /* 4096 in all: taken, twice in a row */
    CHECK_INT(rl_reader_reset(&rd), 0);
    for (int k = 0; k < 2; k++) {
        CHECK_INT(rl_reader_feed(&rd, "*4\r\n", 4), 0);
        for (int a = 0; a < 4; a++) {
            CHECK_INT(rl_reader_feed(&rd, "*1023\r\n", 7), 0);
            for (int i = 0; i < 1023; i++) CHECK_INT(rl_reader_feed(&rd, ":1\r\n", 4), 0);
        }
        CHECK_INT(rl_reader_next(&rd, &r), 1);
        CHECK_INT(r->type, RL_REPLY_ARRAY);
    }
}

/* Feed s in pieces of step bytes (0: at once), taking replies after every
 * feed until the reader refuses the stream. Return the replies taken, and
 * in *refused whether it refused. */
static int replies_before_refusal(const char *s, size_t len, size_t step, int *refused) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    int got = 0, rc = 0;
    const rl_reply *r;
    if (step == 0) step = len;
    for (size_t at = 0; at < len && rc >= 0; at += step) {
        CHECK_INT(rl_reader_feed(&rd, s + at, len - at < step ? len - at : step), 0);
        while ((rc = rl_reader_next(&rd, &r)) == 1) got++;
    }
    *refused = rc < 0;
    return got;
}

/* Found by fuzz_reply: a string over RL_REPLY_MAX_STRING, or a line over
 * RL_REPLY_MAX_BUFFERED, was refused when it came in pieces (the limits were
 * only checked on a reply still waiting for bytes) but accepted when it all
 * came in one read. Whatever the reads, the same replies come out, and the
 * stream is refused at the same reply. */
static void refuses_alike_however_the_bytes_are_cut(void) {
    size_t big = RL_REPLY_MAX_BUFFERED + 1000;
    char *s = malloc(big + 64);
    CHECK(s != NULL);
    struct {
        const char *head;  /* then n bytes of 'a', then tail */
        size_t n;
        const char *tail;
        int replies;       /* taken before the refusal */
    } cases[] = {
        {"+OK\r\n$70000\r\n", 70000, "\r\n:1\r\n", 1},           /* a string too long */
        {"+OK\r\n*2\r\n:1\r\n$70000\r\n", 70000, "\r\n:1\r\n", 1}, /* nested */
        {"+OK\r\n+", big, "\r\n:1\r\n", 1},                         /* a line too long */
        {"+OK\r\n*2\r\n-", big, "\r\n:1\r\n:1\r\n", 1},             /* nested */
        {"+OK\r\n$65536\r\n", 65536, "\r\n:1\r\n", -1},          /* the largest string: accepted */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t hl = strlen(cases[c].head), tl = strlen(cases[c].tail);
        memcpy(s, cases[c].head, hl);
        memset(s + hl, 'a', cases[c].n);
        memcpy(s + hl + cases[c].n, cases[c].tail, tl);
        size_t len = hl + cases[c].n + tl;
        const size_t steps[] = {0, 1 << 20, 16384, 4096, 1000, 7};
        for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
            int refused = 0;
            int got = replies_before_refusal(s, len, steps[k], &refused);
            if (cases[c].replies < 0) {
                CHECK_INT(got, 3);
                CHECK_INT(refused, 0);
            } else {
                CHECK_INT(got, cases[c].replies);
                CHECK_INT(refused, 1);
            }
        }
    }
    free(s);
}

static void finds_the_run_id_in_info(void) {
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char body[] = "# Server\r\nredis_version:7.0.0\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\ntcp_port:1\r\n";
    char s[256];
    int n = snprintf(s, sizeof(s), "$%zu\r\n%s\r\n+OK\r\n", sizeof(body) - 1, body);
    CHECK_INT(rl_reader_feed(&rd, s, (size_t)n), 0);
    const rl_reply *r = next();
    CHECK_INT(r->type, RL_REPLY_STRING);
    CHECK_STR(r->run_id, "0123456789abcdef0123456789abcdef01234567");
    CHECK_STR(next()->run_id, "");
}

/* Found by fuzz_reply: a run_id of 40 bytes holding a NUL was taken as is,
 * and compared as the shorter string before the NUL (two servers sharing
 * that prefix looked like one; a NUL first looked like no run_id). Only 40
 * hex digits are a run_id. */
static void takes_only_hex_run_ids(void) {
    const char *bad[] = {"run_id:aaaaaaaaaaaaaaaaaaaaaa\0\0`0\0\3>)aaaaaaaaaa\r\n", "run_id:\0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
                         "run_id:0123456789abcdef0123456789abcdef0123456g\r\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_INT(rl_reader_reset(&rd), 0);
        char s[256];
        size_t body = 7 + 40 + 2; /* every line above: the tag, 40 bytes, CRLF */
        int n = snprintf(s, sizeof(s), "$%zu\r\n", body);
        memcpy(s + n, bad[i], body);
        memcpy(s + n + body, "\r\n", 2);
        CHECK_INT(rl_reader_feed(&rd, s, (size_t)n + body + 2), 0);
        const rl_reply *r = next();
        CHECK_INT(r->type, RL_REPLY_STRING);
        CHECK_INT(r->len, body);
        CHECK_STR(r->run_id, "");
    }
    CHECK_INT(rl_reader_reset(&rd), 0);
    const char upper[] = "$49\r\nrun_id:0123456789ABCDEF0123456789ABCDEF01234567\r\n\r\n";
    CHECK_INT(rl_reader_feed(&rd, upper, sizeof(upper) - 1), 0);
    CHECK_STR(next()->run_id, "0123456789ABCDEF0123456789ABCDEF01234567");
}

int main(void) {
    refuses_a_huge_declared_string_before_its_bytes();
    refuses_huge_arrays_and_endless_lines();
    refuses_endless_nested_arrays();
    refuses_alike_however_the_bytes_are_cut();
    finds_the_run_id_in_info();
    takes_only_hex_run_ids();
    parses_what_rounds_get();
    waits_for_replies_split_across_reads();
    keeps_arrays_as_one_reply_and_skips_their_elements();
    cuts_long_texts_but_keeps_their_length();
    reports_protocol_errors();
    rl_reader_free(&rd);
    return check_report("test_reply");
}
