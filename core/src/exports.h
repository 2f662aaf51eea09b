/*
 * exports.h — the core exports exactly the functions redlock.h declares.
 *
 * Every core source is compiled with -fvisibility=hidden and has this file
 * included before its first line (-include, see CMakeLists.txt). Here, and
 * only here, the declarations of redlock.h get default visibility; a
 * definition takes the visibility of the declaration before it, so the public
 * functions are exported from redlock_core.so and the host executable, and
 * everything else (rl_stream_*, rl_round_*, the script texts, ...) stays inside
 * them. Visibility does not change static linking: libredlock.a still
 * resolves every internal symbol for the C tests.
 *
 * redlock.h itself stays plain (the FFI mirror and spec/cdefs_spec.lua read
 * it); its include guard makes the sources' own #include "redlock.h" a no-op.
 */
#pragma GCC visibility push(default)
#include "redlock.h"
#pragma GCC visibility pop
