rockspec_format = "3.0"
package = "redlock"
version = "0.4.0-1"

-- The release rockspec of 0.4.0. scripts/pack-rock makes the source tarball
-- redlock-0.4.0.tar.gz from the checkout and packs it with this file (luarocks
-- pack) into redlock-0.4.0-1.src.rock, which builds anywhere, offline:
--   scripts/pack-rock                                   # build-pkg/redlock-0.4.0-1.src.rock
--   luarocks --lua-version=5.1 install build-pkg/redlock-0.4.0-1.src.rock
-- source.url names that tarball: inside the .src.rock it sits beside this file.
source = {
  url = "redlock-0.4.0.tar.gz",
  dir = "redlock-0.4.0",
}

description = {
  summary = "Redlock distributed locks for LuaJIT: a C core over N Redis masters",
  detailed = [[
redlock implements the Redlock algorithm: a lock is granted when a majority of
N independent Redis (or Valkey/KeyDB) masters agree, all asked at once over
non-blocking connections. The C core (hiredis + libev, TLS with OpenSSL) runs
the rounds; the Lua module (require "redlock", LuaJIT FFI) holds retry
policies, lock objects, lock_many, with_lock, fencing tokens and hand-off to
waiters, on plain LuaJIT and inside nginx's lua module.
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
    -- C library for C programs (the Debian package has those).
    BUILD_TESTING = "OFF",
    REDLOCK_BUILD_HOST = "OFF",
    REDLOCK_C_LIBRARY = "OFF",
    -- Nor the docs: LuaRocks gives CMake no install prefix, so they would go
    -- to /usr/local/share/doc, outside the tree.
    REDLOCK_INSTALL_DOCS = "OFF",
  },
}
