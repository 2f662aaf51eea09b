/* names.h — an index from names (byte strings the caller owns and keeps
 * unchanged while indexed) to small non-negative ints: open addressing,
 * lookups in O(1) on average, whatever the number of names. A name may be
 * indexed more than once (under different values); a lookup gives the one
 * indexed first that is still there. */
#ifndef RL_NAMES_H
#define RL_NAMES_H

#include <stddef.h>

typedef struct rl_name_entry {
    const char *name;  /* borrowed from the caller */
    size_t len;
    unsigned hash;
    int value;         /* >= 0; negative for a free place (empty, or a name removed) */
} rl_name_entry;

typedef struct rl_names {
    rl_name_entry *e;  /* cap places (a power of two, or 0) */
    size_t cap, live, gone;
} rl_names;

/* Index name (len bytes, kept by the caller until removed) under value
 * (>= 0). Return 0, or -1 when out of memory (nothing changed). */
int rl_names_add(rl_names *m, const char *name, size_t len, int value);

/* The value name is indexed under (the first, if several), or -1. */
int rl_names_find(const rl_names *m, const char *name, size_t len);

/* Take name's entry under value out of the index (none: nothing happens). */
void rl_names_remove(rl_names *m, const char *name, size_t len, int value);

/* Free the index (not the names); m is empty after. */
void rl_names_free(rl_names *m);

#endif
