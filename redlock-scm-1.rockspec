rockspec_format = "3.0"
package = "redlock"
version = "scm-1"

-- The scm rockspec is for `luarocks make` in a checkout:
--   luarocks --lua-version=5.1 make redlock-scm-1.rockspec
-- Release rockspecs live in rocks/ (scripts/pack-rock packs one into a .src.rock).
source = {
  url = "git+file://.",
}

description = {
  summary = "Redlock distributed locks for LuaJIT: a C core over N Redis masters",
  detailed = [[
redlock implements the Redlock algorithm: a lock is granted when a majority of
N independent Redis (or Valkey/KeyDB) masters agree, all asked at once over
non-blocking connections. The C core (hiredis async + libev) runs the rounds;
the Lua module (require "redlock", LuaJIT FFI) holds retry policies, lock
objects, lock_many and with_lock.
]],
  license = "MIT",
  labels = { "redis", "lock", "redlock", "distributed", "luajit", "ffi" },
}

-- The module uses the LuaJIT FFI: LuaJIT (Lua 5.1 ABI) only.
dependencies = {
  "lua ~> 5.1",
}

external_dependencies = {
  HIREDIS = { header = "hiredis/hiredis.h" },
  LIBEV = { header = "ev.h" },
  OPENSSL = { header = "openssl/ssl.h" }, -- TLS (rediss://)
}

build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_C_FLAGS = "$(CFLAGS)",
    -- Install where LuaRocks wants the files (CMakeLists.txt honours these).
    INSTALL_LUA_DIR = "$(LUADIR)",
    INSTALL_LIB_DIR = "$(LIBDIR)",
    -- Only the module and the Lua files: no C tests, no host executable, no
    -- C library for C programs.
    BUILD_TESTING = "OFF",
    REDLOCK_BUILD_HOST = "OFF",
    REDLOCK_C_LIBRARY = "OFF",
    -- Nor the docs: LuaRocks gives CMake no install prefix, so they would go
    -- to /usr/local/share/doc, outside the tree.
    REDLOCK_INSTALL_DOCS = "OFF",
  },
}
