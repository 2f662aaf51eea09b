/*
 * main.c — the `redlock` executable: LuaJIT with the redlock core linked in.
 *
 * Shaped like LuaJIT's own luajit.c: main() creates the state and runs pmain
 * under lua_cpcall; pmain opens the libraries, finds the Lua modules next to
 * the executable, builds the standard `arg` table and hands over to
 * require("redlock.host").main(arg), whose return value is the exit status.
 * Everything a user sees beyond that (subcommands, options, messages) is Lua.
 *
 * Errors that escape the Lua side are reported as "redlock: message" plus a
 * traceback on stderr, with exit status 1. Every exit path (normal, error,
 * os.exit, SIGINT/SIGTERM/SIGHUP/SIGQUIT) releases the locks still kept first.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host.h"
#include "lauxlib.h"
#include "lua.h"
#include "luajit.h"
#include "lualib.h"

static const char *progname = RL_HOST_PROGNAME;

static struct {
    int argc;
    char **argv;
    int status;
} smain;

static void l_message(const char *msg) {
    fprintf(stderr, "%s: %s\n", progname, msg);
    fflush(stderr);
}

static int report(lua_State *L, int status) {
    if (status && !lua_isnil(L, -1)) {
        const char *msg = lua_tostring(L, -1);
        l_message(msg ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

static int traceback(lua_State *L) {
    if (!lua_isstring(L, 1)) { /* non-string error object: try its __tostring */
        if (lua_isnoneornil(L, 1) || !luaL_callmeta(L, 1, "__tostring") || !lua_isstring(L, -1))
            return 1;
        lua_remove(L, 1);
    }
    luaL_traceback(L, L, lua_tostring(L, 1), 1);
    return 1;
}

static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    int status = lua_pcall(L, narg, nres, base);
    lua_remove(L, base);
    if (status != 0) lua_gc(L, LUA_GCCOLLECT, 0);
    return status;
}

/* os.execute without system(3)'s "ignore SIGINT in the caller": a signal to
 * the host still releases its locks, and stops the command first. Returns the
 * raw wait status, as LuaJIT's os.execute does. */
static int host_execute(lua_State *L) {
    const char *cmd = luaL_optstring(L, 1, NULL);
    lua_pushinteger(L, rl_host_system(cmd));
    return 1;
}

/* arg[0] is the executable as invoked, arg[1..] the command line. */
static void push_args(lua_State *L) {
    lua_createtable(L, smain.argc, 1);
    for (int i = 0; i < smain.argc; i++) {
        lua_pushstring(L, smain.argv[i]);
        lua_rawseti(L, -2, i);
    }
}

static int pmain(lua_State *L) {
    /* No LUAJIT_VERSION_SYM() check: Debian's luajit2 (OpenResty branch)
     * does not export luaJIT_version_2_1_0_beta3. */
    lua_gc(L, LUA_GCSTOP, 0);
    luaL_openlibs(L);
    lua_gc(L, LUA_GCRESTART, -1);

    if (rl_host_set_paths(L) != 0) {
        l_message("cannot find the executable's own path (/proc/self/exe); set LUA_PATH");
        lua_newtable(L);
        lua_getglobal(L, "package");
        lua_getfield(L, -1, "loaded");
        lua_pushvalue(L, -3);
        lua_setfield(L, -2, "redlock.host.self");
        lua_pop(L, 3);
    }
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");
    lua_getfield(L, -1, "redlock.host.self");
    lua_pushliteral(L, REDLOCK_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushliteral(L, LUAJIT_VERSION);
    lua_setfield(L, -2, "luajit");
    lua_pop(L, 3);
    lua_getglobal(L, "os");
    lua_pushcfunction(L, host_execute);
    lua_setfield(L, -2, "execute");
    lua_pop(L, 1);
    push_args(L);
    lua_setglobal(L, "arg");

    lua_getglobal(L, "require");
    lua_pushliteral(L, "redlock.host");
    if (report(L, docall(L, 1, 1))) {
        smain.status = 1;
        return 0;
    }
    lua_getfield(L, -1, "main");
    lua_getglobal(L, "arg");
    if (report(L, docall(L, 1, 1))) {
        smain.status = 1;
        return 0;
    }
    lua_Integer code = lua_tointeger(L, -1);
    smain.status = code < 0 ? 1 : code > 255 ? 255 : (int)code;
    return 0;
}

/* Open /dev/null on whichever of fds 0-2 is closed, before anything else
 * opens a file: otherwise the host's own pipes and sockets would take those
 * numbers, its messages would go into a node's socket, and a command would
 * get one of them as its standard input or output. Return 0, or -1 if a
 * closed one cannot be filled. */
static int fill_std_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
        int null = open("/dev/null", O_RDWR); /* the lowest free number: fd itself */
        if (null < 0) return -1;
        if (null != fd) {
            int ok = dup2(null, fd) == fd;
            close(null);
            if (!ok) return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (fill_std_fds() != 0) return EXIT_FAILURE;
    if (rl_host_signals_start() != 0) {
        fprintf(stderr, "%s: cannot set up signal handling: %s\n", progname, strerror(errno));
        return EXIT_FAILURE;
    }
    atexit(rl_host_finish); /* os.exit() from a script releases its locks too */
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        l_message("cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    smain.argc = argc;
    smain.argv = argv;
    int status = lua_cpcall(L, pmain, NULL);
    report(L, status);
    rl_host_finish(); /* before lua_close: finalizers may free the keepers */
    lua_close(L);
    return status ? EXIT_FAILURE : smain.status;
}
