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

#include "command.h"

#define RL_REPLY_TEXT_LEN 96

/* What a node may send us. Every reply to our commands is small (the largest
 * is INFO server, a few KB): a reply that declares a longer string or more
 * elements, or unparsed bytes piling up past the buffer bound, is a protocol
 * error for the connection, found before its bytes are even waited for. */
#define RL_REPLY_MAX_STRING 65536
#define RL_REPLY_MAX_ELEMENTS 1024
#define RL_REPLY_MAX_NESTED (4 * RL_REPLY_MAX_ELEMENTS) /* elements of one reply, at every depth */
#define RL_REPLY_MAX_BUFFERED (2 * RL_REPLY_MAX_STRING)

/* How many string elements of an array reply a reader keeps (rl_reader.keep):
 * a pub/sub message's kind, channel and payload. */
#define RL_REPLY_KEPT 3

/* A server's run_id: 40 hex characters. */
#define RL_RUN_ID_LEN 40

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
    char run_id[RL_RUN_ID_LEN + 1];  /* a string holding a "run_id:" line (INFO server): its value, else "" */
} rl_reply;

/* The value of a "run_id:" line in text[0..len) (INFO server), copied to
 * out (RL_RUN_ID_LEN + 1 bytes) when it is RL_RUN_ID_LEN hex digits; out is
 * "" otherwise (a run_id holding a NUL would compare as a shorter one: two
 * servers could look like one). Sets out only where it finds one. */
void rl_reply_run_id(const char *text, size_t len, char *out);

/* One connection's reply stream.
 *
 * What the reader accepts does not depend on how the stream was cut into
 * reads: a limit that only a buffered (incomplete) reply could reveal is
 * checked on complete replies too. A string longer than
 * RL_REPLY_MAX_STRING is refused whether its bytes are all in or not; a run
 * of more than RL_REPLY_MAX_BUFFERED bytes without CRLF (a line no reply of
 * ours has, since every string is shorter) is refused in the reply that
 * holds it, whether that reply is complete or not. A subscriber's reader
 * raises the string limit to its frame cap (max_string; the buffered and
 * the line limits are then twice that), and keeps the first RL_REPLY_KEPT
 * string elements of an array (keep), which a message is made of. Both are
 * the owner's to set, before feeding; rl_reader_reset leaves them. */
typedef struct rl_reader {
    redisReader *reader;
    rl_reply slot;                 /* the reply rl_reader_next last returned */
    char err[128];                 /* why the stream was refused (a limit above), or "" */
    unsigned long long fed;        /* bytes fed since the reset */
    unsigned long long long_at;    /* offset of the first byte past RL_REPLY_MAX_BUFFERED without CRLF,
                                      or ULLONG_MAX */
    size_t run;                    /* bytes since the last CRLF */
    int after_cr;                  /* the last byte fed was '\r' */
    size_t max_string;             /* longest string accepted; 0: RL_REPLY_MAX_STRING */
    int keep;                      /* 1: keep the string elements of an array reply (rl_reader_element) */
    int keep_top;                  /* 1: keep a string reply's bytes whole, as element 0 (a cluster's
                                      CLUSTER NODES text) */
    rl_buf kept;                   /* their bytes, back to back */
    size_t kept_at[RL_REPLY_KEPT], kept_len[RL_REPLY_KEPT];
    int nkept;                     /* elements kept (a non-string element is kept as absent) */
    int elements;                  /* elements of the reply being read, at every depth */
    char kept_str[RL_REPLY_KEPT];  /* kept_str[i]: element i is a string */
} rl_reader;

/* Prepare (or, on a reader in use, restart: buffered bytes are dropped).
 * Return 0, or -1 when out of memory. */
int rl_reader_reset(rl_reader *rd);

void rl_reader_free(rl_reader *rd);

/* Append bytes read from the socket. Return 0, or -1 when out of memory. */
int rl_reader_feed(rl_reader *rd, const char *buf, size_t len);

/* Take the next complete reply: 1 and *out set (valid until the next call),
 * 0 when more bytes are needed, -1 on a protocol error (rl_reader_error says
 * which; the stream cannot be resumed). A reply over the limits above is a
 * protocol error as soon as its header is in: call this after every feed, so
 * unparsed bytes never pile up. */
int rl_reader_next(rl_reader *rd, const rl_reply **out);

const char *rl_reader_error(const rl_reader *rd);

/* With keep set: string element i (0 .. RL_REPLY_KEPT-1) of the array reply
 * rl_reader_next last returned, its length in *len; NULL when that reply is
 * no array, has no element i, or element i is not a string. Valid until the
 * next call on rd. */
const char *rl_reader_element(const rl_reader *rd, int i, size_t *len);

/* Bytes of the stream the replies handed out so far have taken (where the
 * next reply begins): a subscriber measures its frames with it. */
unsigned long long rl_reader_consumed(const rl_reader *rd);

#endif
