/* text.h — error texts in fixed buffers. */
#ifndef RL_TEXT_H
#define RL_TEXT_H

#include <string.h>

/* dst (cap bytes) = prefix .. text, cut to fit and NUL-terminated; an empty
 * or NULL text reads "unknown error". */
static inline void rl_text_join(char *dst, size_t cap, const char *prefix, const char *text) {
    if (text == NULL || *text == '\0') text = "unknown error";
    size_t room = cap - 1;
    size_t plen = strnlen(prefix, room);
    size_t tlen = strnlen(text, room - plen);
    memmove(dst, prefix, plen);
    memmove(dst + plen, text, tlen);
    dst[plen + tlen] = '\0';
}

#endif
