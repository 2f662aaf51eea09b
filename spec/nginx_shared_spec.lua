-- Shared holds inside nginx (the cosocket transport): requests take shared
-- holds of one resource, together, while a plain LuaJIT process takes the
-- exclusive hold of it now and then; both log their critical sections, and
-- the history shows readers together and the writer alone.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local history = require "helpers.history"
local proc = require "helpers.proc"

local res = cluster.names("nginx_shared")

describe("shared holds inside nginx", function()
  local cl, srv, dir

  setup(function()
    cl = cluster.start(5)
    dir = proc.tmpdir()
    srv = nginx.start_tree {
      workers = 2,
      init = ([[
        redlock = require "redlock"
        sproc = require "helpers.proc"
        DLM = redlock.new { servers = %s, ttl = 3000 }
        LOG = %q
      ]]):format(nginx.lua_list(cl.urls), dir .. "/readers.log"),
      locations = { [[
        location = /read {
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { shared = true, wait = 10000,
                                                        keepalive = ngx.var.arg_keep == "1" })
            if not lock then ngx.say("fail ", err) return end
            -- the history's lines (helpers/history.lua), one holder per request
            SEQ = (SEQ or 0) + 1
            local log, who = assert(io.open(LOG, "ab")), ngx.worker.pid() .. " " .. SEQ
            log:setvbuf("no")
            log:write(("enter %s %d\n"):format(who, sproc.now_us()))
            ngx.sleep(tonumber(ngx.var.arg_hold) / 1000)
            local valid = lock:valid()
            log:write(("exit %s %d\n"):format(who, sproc.now_us()))
            log:close()
            local ok, uerr = lock:unlock()
            ngx.say(lock.shared and "shared" or "exclusive", " ", valid and "valid" or "invalid", " ",
                    ok and "unlocked" or tostring(uerr))
          }
        }]] },
    }
  end)

  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
    if dir then proc.rmdir(dir) end
  end)

  it("holds readers together in requests while a LuaJIT process takes the writer's hold alone", function()
    local r = res("mixed")
    local argv = { "luajit", "spec/helpers/shared_worker.lua", "writer", dir, r, "3000", "4" }
    for _, u in ipairs(cl.urls) do argv[#argv + 1] = u end
    local writer = proc.spawn_luajit(argv, dir .. "/writer.out")
    local reqs = {}
    for i = 1, 16 do
      reqs[i] = { path = ("/read?r=%s&hold=%d&keep=%d"):format(r, 150, i % 2), after_ms = (i - 1) * 40 }
    end
    local rs = srv:get_many(reqs, 16)
    assert(proc.wait_gone(writer, 30000), "the writer did not finish")
    local out = proc.read_file(dir .. "/writer.out") or ""
    for i, q in ipairs(rs) do
      assert.are.equal(200, q.status, q.err)
      assert.are.equal("shared valid unlocked\n", q.body, "request " .. i)
    end
    assert.matches("exclusive=4 failed=0 late=0", out)
    local readers = proc.read_file(dir .. "/readers.log") or ""
    local writers = proc.read_file(dir .. "/writers.log") or ""
    local all = history.check(readers .. writers, { text = true })
    local only_readers = history.check(readers, { text = true })
    assert.are.equal(16, only_readers.acquisitions)
    assert.are.equal(20, all.acquisitions)
    assert.are.equal(0, all.overlaps - only_readers.overlaps, table.concat(all.examples, "; "))
    assert.is_true(only_readers.overlaps > 0, "no two requests held it at once")
    assert.are.equal(0, all.unfinished + all.malformed)
  end)
end)
