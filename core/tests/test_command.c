/* test_command.c — the RESP bytes of each command, and lock values. */
#define _GNU_SOURCE /* memmem */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#include "redlock.h"
#include "../src/command.h"
#include "../src/value.h"
#include "check.h"

static const char *V = "0123456789abcdef0123456789abcdef01234567";

static void encodes_set_nx_px(void) {
    rl_buf b = {0};
    CHECK_INT(rl_cmd_acquire(&b, "re\0s", 4, V, 1500), 0);
    const char want[] = "*6\r\n$3\r\nSET\r\n$4\r\nre\0s\r\n$40\r\n0123456789abcdef0123456789abcdef01234567\r\n"
                        "$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1500\r\n";
    CHECK_INT(b.len, sizeof(want) - 1);
    CHECK(memcmp(b.data, want, b.len) == 0);
    rl_buf_free(&b);
}

static void encodes_scripts_by_sha_and_by_source(void) {
    rl_buf b = {0};
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, V, "fedcba9876543210"), 0);
    const char want[] = "*6\r\n$7\r\nEVALSHA\r\n$40\r\n7205bbba00977f9b6b2fe01cccf64e0a4c625512\r\n$1\r\n1\r\n"
                        "$1\r\nk\r\n$40\r\n0123456789abcdef0123456789abcdef01234567\r\n$16\r\nfedcba9876543210\r\n";
    CHECK_INT(b.len, sizeof(want) - 1);
    CHECK(memcmp(b.data, want, b.len) == 0);
    CHECK_INT(rl_cmd_extend(&b, 0, "k", 1, V, 30000), 0);
    CHECK(memcmp(b.data, "*6\r\n$4\r\nEVAL\r\n", 14) == 0);
    CHECK(memmem(b.data, b.len, "pexpire", 7) != NULL);
    CHECK(b.len > 11 && memcmp(b.data + b.len - 11, "$5\r\n30000\r\n", 11) == 0);
    rl_buf_free(&b);
}

/* Each script sent by its SHA1 carries the SHA1 of its own text: a stale
 * constant would make every node answer NOSCRIPT, and every such command
 * go twice. */
static void script_shas_match_their_scripts(void) {
    const char *const scripts[] = {rl_release_script, rl_extend_script, rl_release_slot_script,
                                   rl_acquire_slot_script};
    const char *const shas[] = {rl_release_sha, rl_extend_sha, rl_release_slot_sha, rl_acquire_slot_sha};
    for (int i = 0; i < 4; i++) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        char hex[2 * EVP_MAX_MD_SIZE + 1];
        CHECK_INT(EVP_Digest(scripts[i], strlen(scripts[i]), md, &mdlen, EVP_sha1(), NULL), 1);
        for (unsigned int k = 0; k < mdlen; k++) snprintf(hex + 2 * k, 3, "%02x", md[k]);
        CHECK_STR(hex, shas[i]);
    }
}

static void encodes_a_waiters_acquire_whole(void) {
    rl_buf b = {0};
    CHECK_INT(rl_cmd_acquire_queued(&b, "k", 1, V, 1500, "0123456789abcdef"), 0);
    CHECK(memcmp(b.data, "*7\r\n$4\r\nEVAL\r\n", 14) == 0);
    CHECK(memmem(b.data, b.len, rl_acquire_queued_script, strlen(rl_acquire_queued_script)) != NULL);
    const char tail[] = "$1\r\n1\r\n$1\r\nk\r\n$40\r\n0123456789abcdef0123456789abcdef01234567\r\n"
                        "$4\r\n1500\r\n$16\r\n0123456789abcdef\r\n";
    CHECK(b.len > sizeof(tail) && memcmp(b.data + b.len - (sizeof(tail) - 1), tail, sizeof(tail) - 1) == 0);
    rl_buf_free(&b);
}

static void encodes_any_command_after_what_is_queued(void) {
    rl_buf b = {0};
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, V, NULL), 0);
    size_t before = b.len;
    const char *argv[] = {"AUTH", "user", "pa ss\r\n"};
    size_t lens[] = {4, 4, 7};
    CHECK_INT(rl_cmd_append_argv(&b, 3, argv, lens), 0);
    const char want[] = "*3\r\n$4\r\nAUTH\r\n$4\r\nuser\r\n$7\r\npa ss\r\n\r\n";
    CHECK_INT(b.len - before, sizeof(want) - 1);
    CHECK(memcmp(b.data + before, want, sizeof(want) - 1) == 0);
    rl_buf_free(&b);
}

static void encodes_large_keys_and_ttls(void) {
    rl_buf b = {0};
    size_t keylen = 100000;
    char *key = malloc(keylen);
    CHECK(key != NULL);
    memset(key, 'k', keylen);
    CHECK_INT(rl_cmd_extend(&b, 1, key, keylen, V, 2147483647), 0);
    const char keyhead[] = "$100000\r\nkkk", tail[] = "$10\r\n2147483647\r\n";
    CHECK(memmem(b.data, b.len, keyhead, sizeof(keyhead) - 1) != NULL);
    CHECK(b.len > sizeof(tail) && memcmp(b.data + b.len - (sizeof(tail) - 1), tail, sizeof(tail) - 1) == 0);
    free(key);
    rl_buf_free(&b);
}

/* prefix .. resource decides, whichever part the reserved bytes fall in */
static void knows_which_keys_are_ours(void) {
    CHECK(rl_reserved_key("", 0, "redlock:queue:zz", 16) != NULL);
    CHECK(rl_reserved_key("redlock:", 8, "x", 1) != NULL);
    CHECK(rl_reserved_key("red", 3, "lock:x", 6) != NULL);
    CHECK(rl_reserved_key("redlock", 7, ":", 1) != NULL);
    CHECK(rl_reserved_key("", 0, "x:fence", 7) != NULL);
    CHECK(rl_reserved_key("x:fe", 4, "nce", 3) != NULL);
    CHECK(rl_reserved_key("", 0, ":fence", 6) != NULL);
    CHECK(rl_reserved_key("app:", 4, "redlock:queue:zz", 16) == NULL);
    CHECK(rl_reserved_key("", 0, "redlock", 7) == NULL);
    CHECK(rl_reserved_key("", 0, "redlock\0:", 9) == NULL);
    CHECK(rl_reserved_key("", 0, "x:fenced", 8) == NULL);
    CHECK(rl_reserved_key("", 0, "fence", 5) == NULL);
    CHECK(rl_reserved_key("fence:", 6, "x", 1) == NULL);
    CHECK_INT(rl_key_in_namespace("redlock:", 8, "", 0), 1);
    CHECK_INT(rl_key_in_namespace("redlock", 7, "", 0), 0);
}

static void values_are_hex_and_distinct(void) {
    char a[RL_VALUE_LEN + 1], b[RL_VALUE_LEN + 1];
    CHECK_INT(rl_value_generate(a), 0);
    CHECK_INT(strlen(a), RL_VALUE_LEN);
    CHECK_INT(strspn(a, "0123456789abcdef"), RL_VALUE_LEN);
    for (int i = 0; i < 1000; i++) {
        CHECK_INT(rl_value_generate(b), 0);
        if (strcmp(a, b) == 0) CHECK(!"two equal values");
    }
}

/* A cluster node's form of a one-key script: the base as a second key;
 * anything else is left as it is, and so is the extend script (before, it
 * named the base too, and a slot in migration answered TRYAGAIN to it on
 * both sides until the migration ended). */
static void adds_the_base_as_a_second_key(void) {
    rl_buf b = {0}, c = {0};
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, V, NULL), 0);
    CHECK_INT(rl_cmd_with_base(&c, &b, "{k}", 3), 0);
    char want[256];
    snprintf(want, sizeof(want), "*7\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n2\r\n$1\r\nk\r\n$3\r\n{k}\r\n$40\r\n%s\r\n$5\r\nquiet\r\n",
             rl_release_sha, V);
    CHECK_INT(c.len, strlen(want));
    CHECK(c.len == strlen(want) && memcmp(c.data, want, c.len) == 0);
    CHECK_INT(rl_cmd_acquire(&b, "k", 1, V, 1500), 0);
    CHECK_INT(rl_cmd_with_base(&c, &b, "{k}", 3), 1);
    CHECK_INT(c.len, 0);
    CHECK_INT(rl_cmd_acquire_fenced(&b, "k", 1, "{k}", 3, V, 1500), 0);
    CHECK_INT(rl_cmd_with_base(&c, &b, "{k}", 3), 1); /* two keys already */
    for (int by_sha = 0; by_sha <= 1; by_sha++) {
        CHECK_INT(rl_cmd_extend(&b, by_sha, "k", 1, V, 1500), 0);
        CHECK_INT(rl_cmd_with_base(&c, &b, "{k}", 3), 1);
        CHECK_INT(c.len, 0);
    }
    rl_buf_free(&b);
    rl_buf_free(&c);
}

/* A counter is a token as INCR leaves one: 1 to 2^63-1, no sign, no
 * leading zero, nothing after the digits. */
static void reads_a_fence_counter_as_a_token_only_as_incr_leaves_one(void) {
    long long token = -1;
    CHECK_INT(rl_fence_token("42", 2, &token), 1);
    CHECK(token == 42);
    CHECK_INT(rl_fence_token("9223372036854775807", 19, &token), 1);
    CHECK(token == 9223372036854775807LL);
    const char *none[] = {"", "0", "00042", "-5", "+7", "4 2", "42x", "9223372036854775808", "99999999999999999999",
                          "123456789012345678901234567890"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        token = -1;
        CHECK_INT(rl_fence_token(none[i], strlen(none[i]), &token), 0);
        CHECK(token == -1);
    }
    CHECK_INT(rl_fence_token("42\0", 3, &token), 0); /* the whole text counts, not up to a NUL */
}

int main(void) {
    adds_the_base_as_a_second_key();
    reads_a_fence_counter_as_a_token_only_as_incr_leaves_one();
    encodes_set_nx_px();
    encodes_scripts_by_sha_and_by_source();
    script_shas_match_their_scripts();
    encodes_a_waiters_acquire_whole();
    encodes_any_command_after_what_is_queued();
    encodes_large_keys_and_ttls();
    knows_which_keys_are_ours();
    values_are_hex_and_distinct();
    return check_report("test_command");
}
