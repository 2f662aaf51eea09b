/* reply.h — RESP replies parsed once, without allocation per reply.
 *
 * hiredis' protocol reader does the parsing; its object functions write the
 * one thing a round needs (type, integer, a bounded copy of the text) into a
 * slot owned by the connection instead of building heap redisReply trees.
 * Nested elements of an array are parsed and skipped: no command we send is
 * answered with an array, so only the array's presence matters. */
#ifndef RL_REPLY_H
#define RL_REPLY_H

#include <hiredis/read.h>

#define RL_REPLY_TEXT_LEN 96

enum {
    RL_REPLY_STRING = 1,
    RL_REPLY_ARRAY = 2,
    RL_REPLY_INTEGER = 3,
    RL_REPLY_NIL = 4,
    RL_REPLY_STATUS = 5,
    RL_REPLY_ERROR = 6
};

typedef struct rl_reply {
    int type;                      /* RL_REPLY_* */
    long long integer;             /* RL_REPLY_INTEGER */
    size_t len;                    /* length of the text on the wire */
    char str[RL_REPLY_TEXT_LEN];   /* status, error or string text, NUL-terminated, cut to fit */
} rl_reply;

/* One connection's reply stream. */
typedef struct rl_reader {
    redisReader *reader;
    rl_reply slot;                 /* the reply rl_reader_next last returned */
} rl_reader;

/* Prepare (or, on a reader in use, restart: buffered bytes are dropped).
 * Return 0, or -1 when out of memory. */
int rl_reader_reset(rl_reader *rd);

void rl_reader_free(rl_reader *rd);

/* Append bytes read from the socket. Return 0, or -1 when out of memory. */
int rl_reader_feed(rl_reader *rd, const char *buf, size_t len);

/* Take the next complete reply: 1 and *out set (valid until the next call),
 * 0 when more bytes are needed, -1 on a protocol error (rl_reader_error says
 * which; the stream cannot be resumed). */
int rl_reader_next(rl_reader *rd, const rl_reply **out);

const char *rl_reader_error(const rl_reader *rd);

#endif
