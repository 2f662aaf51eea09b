-- nginx with the C core built under AddressSanitizer + UBSan: what only a
-- sanitizer inside a worker sees. Not a default spec (its name does not end
-- in _spec): scripts/test runs it after building build-asan/, as
--   REDLOCK_BUILD_DIR=build-asan busted --pattern=_asan spec/sanitizers
-- The workers load build-asan/redlock_core.so with the ASan runtime
-- preloaded into nginx (LD_PRELOAD); a report goes to a file of its own.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local asan = require "helpers.asan"

local res = cluster.names("asan")

describe("nginx with the core under ASan", function()
  local state = {}
  asan.nodes(setup, teardown, state, nginx.stop_all)

  -- Before (3656909's parent): at QUIT, lua_close ran the engine's finalizer
  -- before the kept locks' guards, whose release then called into the freed
  -- engine: heap-use-after-free in rl_engine_begin_release.
  it("lets a worker exit with kept locks still referenced, its engine freed first or last", function()
    local cl, dir = state.cl, state.dir
    local srv = nginx.start_tree {
      env = asan.env(dir),
      init = ([[
        redlock = require "redlock"
        ffi = require "ffi"
        ffi.cdef "void __asan_init(void);"
        DLM = redlock.new { servers = %s, ttl = 5000 }
        HELD = {}
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { [[
        location = /hold {
          content_by_lua_block {
            local asan = pcall(function() return ffi.C.__asan_init end)
            local core = require("redlock.cdefs").path
            for i = 1, tonumber(ngx.var.arg_n) do
              local lock, err = DLM:try_lock(ngx.var.arg_r .. ":" .. i, { keepalive = true })
              if not lock then ngx.say("fail ", err) return end
              HELD[#HELD + 1] = lock
            end
            ngx.say("held ", #HELD, " asan=", tostring(asan), " core=", core)
          }
        }]] },
    }
    local status, body = srv:get("/hold?n=40&r=" .. res("exit"))
    assert.are.equal(200, status, tostring(body))
    assert.matches("^held 40 asan=true core=.*asan", body)
    local workers = srv:worker_pids()
    assert.are.equal(1, #workers)
    proc.kill(srv.pid, "QUIT")
    local exited = proc.wait_gone(workers[1], 8000)
    local log = srv:error_log()
    assert(srv:stop { keep = true })
    proc.rmdir(srv.prefix)
    local found = asan.reports(dir)
    assert.are.equal("", found, "sanitizer report:\n" .. found .. "\nerror log:\n" .. log)
    assert.is_true(exited, "the worker did not exit on QUIT within 8 s:\n" .. log)
    assert.is_nil(log:find("exited on signal", 1, true), log)
    assert.is_nil(log:find("exited with code [1-9]"), log)
  end)
end)
