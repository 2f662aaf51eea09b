/* hashslot.h — Redis Cluster's key to hash slot mapping (CRC16-XMODEM of
 * the key, or of its hash tag, modulo 16384), and the hash tag that puts a
 * lock's companion keys (fencing counter, queues, semaphore slots, shared
 * holders, wake-up channels) in the lock key's slot. Pure functions: no
 * I/O, no allocation beyond the buffer handed in. */
#ifndef RL_HASHSLOT_H
#define RL_HASHSLOT_H

#include <stddef.h>

#include "command.h"

#define RL_HASH_SLOTS 16384

/* CRC16-XMODEM (polynomial 0x1021, initial 0) of buf[0..len). */
unsigned rl_crc16(const char *buf, size_t len);

/* The part of key Redis Cluster hashes: the bytes between the first '{' and
 * the first '}' after it when there are any, else the whole key. *len is
 * in/out. */
const char *rl_hash_tag(const char *key, size_t *len);

/* The hash slot (0 .. 16383) of key[0..len). */
int rl_hash_slot(const char *key, size_t len);

/* Write into b (b->len = 0 first) the *base* of key's companion names on
 * a cluster node: every companion name is made of a fixed head free of
 * braces, the base, and a fixed tail (RL_FENCE_SUFFIX), so its hash tag is
 * the base's and it lands in key's slot:
 *   - key holds no '}': "{" key "}" (its tag is the whole key);
 *   - key has a hash tag T already ("a{b}c"): "{T}" key ("{b}a{b}c");
 *   - otherwise ("a}b", "{}x"): "{T}" key, where T is the first string of
 *     the search order below, free of braces, whose CRC16 is key's slot:
 *     the same T on every client, so every client names the same keys.
 * Two keys never share a base: the first '}' of a base ends its first
 * part, which then says which form it is and where the key begins (a key
 * that is a base itself, as "{orders}" is, gets a base of its own).
 * Return 0, or -1 when out of memory. */
int rl_cluster_base(rl_buf *b, const char *key, size_t len);

#endif
