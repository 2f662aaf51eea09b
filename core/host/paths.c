/*
 * paths.c — find the Lua modules next to the executable, without LUA_PATH.
 *
 * Two layouts, told apart by where the running executable lives:
 *   build tree     the executable is in REDLOCK_BUILD_EXE_DIR: modules come from
 *                  the source tree (REDLOCK_SOURCE_LUA_DIR), redlock_core.so from
 *                  REDLOCK_BUILD_LIB_DIR;
 *   install tree   anywhere else: REDLOCK_INSTALL_LUA_DIR and REDLOCK_INSTALL_LIB_DIR,
 *                  relative to the executable's directory unless absolute
 *                  (bin/../share/lua/5.1 and bin/../lib/lua/5.1 by default).
 * The executable's directory comes from /proc/self/exe, so the host works from
 * any working directory and through symlinks. Both directories are put in
 * front of package.path / package.cpath; what LUA_PATH adds still follows.
 * package.loaded["redlock.host.self"] tells the Lua side what was chosen.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host.h"
#include "lauxlib.h"

#ifndef REDLOCK_BUILD_EXE_DIR
#error "REDLOCK_BUILD_EXE_DIR must be defined by the build"
#endif

/* realpath() of path into out (PATH_MAX); 0 or -1. */
static int canonical(const char *path, char *out) {
    return realpath(path, out) ? 0 : -1;
}

/* dir/rel, or rel itself when it is absolute. */
static void push_dir(lua_State *L, const char *dir, const char *rel) {
    if (rel[0] == '/') lua_pushstring(L, rel);
    else if (rel[0] == '\0' || strcmp(rel, ".") == 0) lua_pushstring(L, dir);
    else lua_pushfstring(L, "%s/%s", dir, rel);
}

/* package[field] = prefix .. package[field], with prefix made of patterns under dir. */
static void prepend(lua_State *L, int package, const char *field, const char *dir, const char *pat1,
                    const char *pat2) {
    lua_getfield(L, package, field);
    const char *old = lua_tostring(L, -1);
    if (pat2)
        lua_pushfstring(L, "%s/%s;%s/%s;%s", dir, pat1, dir, pat2, old ? old : "");
    else
        lua_pushfstring(L, "%s/%s;%s", dir, pat1, old ? old : "");
    lua_setfield(L, package, field);
    lua_pop(L, 1);
}

int rl_host_set_paths(lua_State *L) {
    char exe[PATH_MAX], build[PATH_MAX];
    char *slash;
    int in_build;
    if (canonical("/proc/self/exe", exe) != 0) return -1;
    slash = strrchr(exe, '/');
    if (slash == NULL) return -1;
    *slash = '\0'; /* exe is now the executable's directory */
    in_build = canonical(REDLOCK_BUILD_EXE_DIR, build) == 0 && strcmp(build, exe) == 0;

    lua_getglobal(L, "package");
    int package = lua_gettop(L);
    lua_getfield(L, package, "loaded");
    lua_newtable(L); /* package.loaded["redlock.host.self"] */
    int self = lua_gettop(L);
    lua_pushfstring(L, "%s/%s", exe, slash + 1);
    lua_setfield(L, self, "exe");
    lua_pushstring(L, in_build ? "build" : "install");
    lua_setfield(L, self, "layout");
    if (in_build) lua_pushstring(L, REDLOCK_SOURCE_LUA_DIR);
    else push_dir(L, exe, REDLOCK_INSTALL_LUA_DIR);
    lua_setfield(L, self, "lua_dir");
    if (in_build) lua_pushstring(L, REDLOCK_BUILD_LIB_DIR);
    else push_dir(L, exe, REDLOCK_INSTALL_LIB_DIR);
    lua_setfield(L, self, "lib_dir");

    lua_getfield(L, self, "lua_dir");
    prepend(L, package, "path", lua_tostring(L, -1), "?.lua", "?/init.lua");
    lua_pop(L, 1);
    lua_getfield(L, self, "lib_dir");
    prepend(L, package, "cpath", lua_tostring(L, -1), "?.so", NULL);
    lua_pop(L, 1);

    lua_setfield(L, -2, "redlock.host.self");
    lua_pop(L, 2); /* loaded, package */
    return 0;
}
