/* reply.c — hiredis' reader with object functions that fill one slot (see reply.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reply.h"

/* top() stores hiredis' task type as the slot's type: the numbers must agree. */
_Static_assert(RL_REPLY_STRING == REDIS_REPLY_STRING, "RL_REPLY_STRING != REDIS_REPLY_STRING");
_Static_assert(RL_REPLY_ARRAY == REDIS_REPLY_ARRAY, "RL_REPLY_ARRAY != REDIS_REPLY_ARRAY");
_Static_assert(RL_REPLY_INTEGER == REDIS_REPLY_INTEGER, "RL_REPLY_INTEGER != REDIS_REPLY_INTEGER");
_Static_assert(RL_REPLY_NIL == REDIS_REPLY_NIL, "RL_REPLY_NIL != REDIS_REPLY_NIL");
_Static_assert(RL_REPLY_STATUS == REDIS_REPLY_STATUS, "RL_REPLY_STATUS != REDIS_REPLY_STATUS");
_Static_assert(RL_REPLY_ERROR == REDIS_REPLY_ERROR, "RL_REPLY_ERROR != REDIS_REPLY_ERROR");

/* hiredis 1.x reads RESP3 too (it defines REDIS_REPLY_DOUBLE and the other
 * RESP3 types, passes array sizes as size_t, and has two more object
 * functions). We send no HELLO, but a broken or hostile node may still send
 * RESP3 bytes: every type must land in the slot (as a type no round accepts),
 * never as hiredis' placeholder pointer. */
#ifdef REDIS_REPLY_DOUBLE
typedef size_t array_len;
#else
typedef int array_len;
#endif

/* The value handed back for every element nested in an array: non-NULL (the
 * reader treats NULL as out of memory), never dereferenced. */
static char nested;

/* The limits of rd (reply.h): the longest string, and the most bytes
 * buffered or run without CRLF. */
static size_t max_string(const rl_reader *rd) {
    return rd->max_string ? rd->max_string : RL_REPLY_MAX_STRING;
}

static size_t max_buffered(const rl_reader *rd) {
    return rd->max_string ? 2 * rd->max_string : RL_REPLY_MAX_BUFFERED;
}

static rl_reply *top(const redisReadTask *task) {
    if (task->parent != NULL) return NULL;
    rl_reader *rd = task->privdata;
    rd->nkept = 0;
    rd->kept.len = 0;
    rd->elements = 0;
    rl_reply *r = &rd->slot;
    r->type = task->type;
    r->integer = 0;
    r->len = 0;
    r->str[0] = '\0';
    r->run_id[0] = '\0';
    return r;
}

/* Are the n bytes at v all hex digits (as Redis writes a run_id)? */
static int all_hex(const char *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f') || (v[i] >= 'A' && v[i] <= 'F'))) return 0;
    return 1;
}

/* See reply.h. */
void rl_reply_run_id(const char *text, size_t len, char *out) {
    static const char tag[] = "run_id:";
    const size_t tlen = sizeof(tag) - 1;
    for (size_t i = 0; i + tlen + RL_RUN_ID_LEN <= len; i++) {
        if ((i > 0 && text[i - 1] != '\n') || memcmp(text + i, tag, tlen) != 0) continue;
        const char *v = text + i + tlen;
        size_t n = 0;
        while (i + tlen + n < len && v[n] != '\r' && v[n] != '\n') n++;
        if (n == RL_RUN_ID_LEN && all_hex(v, n)) {
            memcpy(out, v, n);
            out[n] = '\0';
        }
        return;
    }
}

/* A bulk string (or, with a RESP3 hiredis, a verbatim one): what the size limit bounds. */
static int is_string(int type) {
#ifdef REDIS_REPLY_VERB
    if (type == REDIS_REPLY_VERB) return 1;
#endif
    return type == REDIS_REPLY_STRING;
}

/* Keep str[0..len) (NULL: an absent element) as the next kept element.
 * Return 0, or -1 when out of memory. */
static int keep_bytes(rl_reader *rd, const char *str, size_t len) {
    int i = rd->nkept++;
    rd->kept_str[i] = str != NULL;
    rd->kept_at[i] = rd->kept.len;
    rd->kept_len[i] = len;
    if (str == NULL || len == 0) return 0;
    if (rl_buf_reserve(&rd->kept, len) != 0) return -1;
    memcpy(rd->kept.data + rd->kept.len, str, len);
    rd->kept.len += len;
    return 0;
}

/* An element of a top-level array, kept if rd keeps elements: its bytes
 * (a string's), or its absence. Return 0, or -1 when out of memory. */
static int keep_element(rl_reader *rd, const redisReadTask *task, const char *str, size_t len) {
    if (!rd->keep || task->parent->parent != NULL || task->idx != rd->nkept || rd->nkept >= RL_REPLY_KEPT) return 0;
    return keep_bytes(rd, str, len);
}

/* An element nested in the reply (at any depth): counted, and kept as
 * keep_element says. The placeholder, or NULL to stop the reader: a reply
 * of more than RL_REPLY_MAX_NESTED elements in all (arrays of arrays, each
 * within RL_REPLY_MAX_ELEMENTS, that would never end), or out of memory. */
static void *nested_element(rl_reader *rd, const redisReadTask *task, const char *str, size_t len) {
    if (++rd->elements > RL_REPLY_MAX_NESTED) {
        snprintf(rd->err, sizeof(rd->err), "reply too large: more than %d elements in all", RL_REPLY_MAX_NESTED);
        return NULL;
    }
    return keep_element(rd, task, str, len) == 0 ? &nested : NULL;
}

static void *create_string(const redisReadTask *task, char *str, size_t len) {
    rl_reader *rd = task->privdata;
    if (is_string(task->type) && len > max_string(rd)) {
        /* over_limits refuses it from its header when the bytes come in
         * pieces; refuse it alike when they came at once */
        snprintf(rd->err, sizeof(rd->err), "reply too large: a string of %zu bytes (at most %zu)", len,
                 max_string(rd));
        return NULL; /* the reader stops with an error */
    }
    rl_reply *r = top(task);
    if (r == NULL) return nested_element(rd, task, is_string(task->type) ? str : NULL, len);
    size_t keep = len < sizeof(r->str) - 1 ? len : sizeof(r->str) - 1;
    memcpy(r->str, str, keep);
    r->str[keep] = '\0';
    r->len = len;
    if (task->type == REDIS_REPLY_STRING) rl_reply_run_id(str, len, r->run_id);
    if (rd->keep_top && task->type == REDIS_REPLY_STRING && keep_bytes(rd, str, len) != 0) return NULL;
    return r;
}

static void *create_array(const redisReadTask *task, array_len elements) {
    rl_reader *rd = task->privdata;
    if ((long long)elements > RL_REPLY_MAX_ELEMENTS) {
        snprintf(rd->err, sizeof(rd->err), "reply too large: an array of %lld elements (at most %d)",
                 (long long)elements, RL_REPLY_MAX_ELEMENTS);
        return NULL; /* the reader stops with an error */
    }
    rl_reply *r = top(task);
    if (r == NULL) return nested_element(rd, task, NULL, 0);
    r->integer = (long long)elements;
    return r;
}

static void *create_integer(const redisReadTask *task, long long value) {
    rl_reply *r = top(task);
    if (r == NULL) return nested_element(task->privdata, task, NULL, 0);
    r->integer = value;
    return r;
}

static void *create_nil(const redisReadTask *task) {
    rl_reply *r = top(task);
    if (r == NULL) return nested_element(task->privdata, task, NULL, 0);
    r->type = RL_REPLY_NIL;  /* a nil array, too */
    return r;
}

#ifdef REDIS_REPLY_DOUBLE
static void *create_double(const redisReadTask *task, double value, char *str, size_t len) {
    (void)value;
    return create_string(task, str, len);
}

static void *create_bool(const redisReadTask *task, int value) {
    return create_integer(task, value);
}
#endif

static void free_object(void *obj) {
    (void)obj; /* nothing was allocated */
}

static redisReplyObjectFunctions slot_functions = {
    .createString = create_string,
    .createArray = create_array,
    .createInteger = create_integer,
    .createNil = create_nil,
#ifdef REDIS_REPLY_DOUBLE
    .createDouble = create_double,
    .createBool = create_bool,
#endif
    .freeObject = free_object,
};

int rl_reader_reset(rl_reader *rd) {
    if (rd->reader) redisReaderFree(rd->reader);
    rd->reader = redisReaderCreateWithFunctions(&slot_functions);
    if (rd->reader == NULL) return -1;
    rd->reader->privdata = rd;
    rd->err[0] = '\0';
    rd->fed = 0;
    rd->long_at = ULLONG_MAX;
    rd->run = 0;
    rd->after_cr = 0;
    return 0;
}

void rl_reader_free(rl_reader *rd) {
    if (rd->reader) redisReaderFree(rd->reader);
    rd->reader = NULL;
    rl_buf_free(&rd->kept);
    rd->nkept = 0;
}

/* Note where the stream first runs longer than max_buffered bytes
 * without CRLF. Jumps from '\n' to '\n' (every reply passes here). */
static void scan_lines(rl_reader *rd, const char *buf, size_t len) {
    const size_t most = max_buffered(rd);
    size_t i = 0;
    while (rd->long_at == ULLONG_MAX && i < len) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len, n = end - i; /* buf[i .. end) holds no '\n' */
        if (rd->run + n > most) {
            rd->long_at = rd->fed + i + (most - rd->run);
            return;
        }
        rd->run += n;
        if (n > 0) rd->after_cr = buf[end - 1] == '\r';
        if (nl == NULL) return;
        if (rd->after_cr) rd->run = 0; /* a CRLF ends the run */
        else if (++rd->run > most) rd->long_at = rd->fed + end;
        rd->after_cr = 0;
        i = end + 1;
    }
}

int rl_reader_feed(rl_reader *rd, const char *buf, size_t len) {
    if (redisReaderFeed(rd->reader, buf, len) != REDIS_OK) return -1;
    scan_lines(rd, buf, len);
    rd->fed += len;
    return 0;
}

/* The reply being read (or just read) holds the over-long run: everything
 * before that reply has been handed out, everything from it on is refused. */
static int holds_long_run(rl_reader *rd, int complete) {
    if (rd->long_at == ULLONG_MAX) return 0;
    /* A complete reply ends where the reader stopped; an incomplete one
     * holds every byte fed (those before it went to earlier replies, which
     * ended before long_at or were refused). */
    unsigned long long read_to = rd->fed - (unsigned long long)(rd->reader->len - rd->reader->pos);
    if (complete && read_to <= rd->long_at) return 0;
    snprintf(rd->err, sizeof(rd->err), "reply too large: more than %zu bytes without CRLF", max_buffered(rd));
    return 1;
}

/* The type of the item the reader is in the middle of, or -1 between replies. */
static int current_type(const redisReader *r) {
    if (r->ridx < 0) return -1;
#ifdef REDIS_REPLY_DOUBLE
    return r->task[r->ridx]->type;
#else
    return r->rstack[r->ridx].type;
#endif
}

/* A reply waits for more bytes: refuse it now if it cannot be one we asked
 * for. The reader has taken the type byte of a string and waits at its
 * length line until the whole payload is in; read the length from there. */
static int over_limits(rl_reader *rd) {
    const redisReader *r = rd->reader;
    const char *p = r->buf + r->pos;
    size_t unparsed = r->len - r->pos;
    int type = current_type(r);
    const long long most = (long long)max_string(rd);
    if (is_string(type) && memchr(p, '\r', unparsed) != NULL) {
        long long declared = 0;
        for (size_t i = 0; i < unparsed && p[i] >= '0' && p[i] <= '9' && declared <= most; i++)
            declared = declared * 10 + (p[i] - '0');
        if (declared > most) {
            size_t n = 0;
            while (n < unparsed && n < 20 && p[n] != '\r') n++;
            snprintf(rd->err, sizeof(rd->err), "reply too large: a string of %.*s bytes (at most %lld)", (int)n, p,
                     most);
            return 1;
        }
    }
    if (unparsed > max_buffered(rd)) {
        snprintf(rd->err, sizeof(rd->err), "reply too large: %zu bytes and not complete (at most %zu)", unparsed,
                 max_buffered(rd));
        return 1;
    }
    return 0;
}

int rl_reader_next(rl_reader *rd, const rl_reply **out) {
    void *obj = NULL;
    if (rd->err[0] || redisReaderGetReply(rd->reader, &obj) != REDIS_OK) return -1;
    if (holds_long_run(rd, obj != NULL)) return -1;
    if (obj == NULL) return over_limits(rd) ? -1 : 0;
    *out = obj;
    return 1;
}

const char *rl_reader_error(const rl_reader *rd) {
    if (rd->err[0]) return rd->err;
    return rd->reader && rd->reader->errstr[0] ? rd->reader->errstr : "protocol error";
}

const char *rl_reader_element(const rl_reader *rd, int i, size_t *len) {
    if (i < 0 || i >= rd->nkept || !rd->kept_str[i]) return NULL;
    *len = rd->kept_len[i];
    return rd->kept_len[i] ? rd->kept.data + rd->kept_at[i] : "";
}

unsigned long long rl_reader_consumed(const rl_reader *rd) {
    return rd->reader ? rd->fed - (unsigned long long)(rd->reader->len - rd->reader->pos) : rd->fed;
}
