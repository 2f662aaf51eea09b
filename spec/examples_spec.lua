-- Every example in examples/ runs, as its header says to run it, against real
-- redis-server nodes, so that none of them rots: hello.lua under LuaJIT, the
-- job scripts under `redlock run`, the retry policy under `redlock exec
-- --policy`, and examples/nginx/run (nginx.conf against `redlock dev` nodes).

local devcluster = require "redlock.devcluster"
local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local nginx = require "helpers.nginx"

local q = proc.quote
local ROOT = proc.root
local BIN = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end
local EXAMPLES = ROOT .. "/examples"

--- Run a shell command from the checkout's root; return its output (stderr
-- merged) and exit status.
local function sh(cmd)
  return proc.sh(("cd %s && %s"):format(q(ROOT), cmd))
end

describe("examples/", function()
  local cl, ENV, TMP

  setup(function()
    assert(io.open(BIN, "rb"), BIN .. " is not built (cmake -S . -B build && cmake --build build)"):close()
    TMP = proc.tmpdir()
    cl = devcluster.start { n = 3 }
    ENV = "REDLOCK_SERVERS=" .. q(table.concat(cl.urls, ","))
  end)

  teardown(function()
    if cl then cl:stop() end
    proc.rmdir(TMP)
  end)

  local function gone_everywhere(key)
    for i = 1, cl.n do
      if cluster.get(cl, i, key) ~= nil then return false end
    end
    return true
  end

  it("hello.lua runs under LuaJIT on its own throwaway cluster", function()
    local out, rc = sh(("env LUA_PATH=%s LUA_CPATH=%s luajit examples/hello.lua")
      :format(q(package.path), q(package.cpath)))
    assert.are.equal(0, rc, out)
    assert.matches('locked "hello": value %x+, valid for %d+ ms\n', out)
    assert.matches("second try_lock: busy\n", out, 1, true)
    assert.matches("extended: %d+ ms left\nunlocked\n", out)
    assert.matches("with_lock returned 42\n", out, 1, true)
  end)

  describe("jobs/ under redlock run", function()
    it("nightly_report.lua: of two machines at once, one builds the report, the other exits 0", function()
      local day = "day" .. proc.getpid()
      local run = ("env %s %s run examples/jobs/nightly_report.lua %s"):format(ENV, q(BIN), day)
      local out, rc = sh(("(%s > %s/a.out 2>&1; echo $? > %s/a.rc) & (%s > %s/b.out 2>&1; echo $? > %s/b.rc) & wait")
        :format(run, q(TMP), q(TMP), run, q(TMP), q(TMP)))
      assert.are.equal(0, rc, out)
      local outs = { proc.read_file(TMP .. "/a.out"), proc.read_file(TMP .. "/b.out") }
      local both = outs[1] .. "\n----\n" .. outs[2]
      assert.are.equal("0", proc.read_file(TMP .. "/a.rc"):match("%d+"), both)
      assert.are.equal("0", proc.read_file(TMP .. "/b.rc"):match("%d+"), both)
      local built, skipped = 0, 0
      for _, o in ipairs(outs) do
        if o:find("report for " .. day .. " done", 1, true) then
          built = built + 1
          assert.matches("building the report for " .. day .. " %(lock value %S+%.%.%.%)\n", o)
          assert.matches("  step 3 done, %d+ ms of validity left\n", o)
        end
        if o:find("another machine is building the report for " .. day, 1, true) then skipped = skipped + 1 end
      end
      assert.are.equal(1, built, both)
      assert.are.equal(1, skipped, both)
      assert.is_true(gone_everywhere("report:" .. day), "the lock was left behind")
    end)

    it("long_computation.lua: a 1 s lock kept through 3 s of Lua that never calls redlock", function()
      local out, rc = sh(("env %s %s run examples/jobs/long_computation.lua 3"):format(ENV, q(BIN)))
      assert.are.equal(0, rc, out)
      assert.matches("^computed %d+ iterations over 3 s while holding a 1 s lock; %d+ ms of validity left\n$", out)
      assert.is_true(gone_everywhere("examples:long-computation"), "the lock was left behind")
    end)
  end)

  describe("jobs/backoff_policy.lua under redlock exec --policy", function()
    it("waits out a holder, then runs the command", function()
      local holder = redlock.new { servers = cl.urls }
      local held = assert(holder:lock("examples:policy", { ttl = 30000 }))
      local out_file = TMP .. "/policy.out"
      local pid = proc.spawn({ "sh", "-c", ("%s exec --policy examples/jobs/backoff_policy.lua examples:policy"
        .. " -- echo ran; echo rc=$?"):format(q(BIN)) },
        { out = out_file, env = { REDLOCK_SERVERS = table.concat(cl.urls, ",") } })
      -- still waiting a while later: the policy backs off, it does not give up on busy
      proc.sleep_ms(1500)
      assert.is_true(proc.alive(pid), proc.read_file(out_file))
      assert.is_nil((proc.read_file(out_file) or ""):find("ran", 1, true))
      assert(held:unlock())
      holder:close()
      assert.is_true(proc.wait_gone(pid, 15000), proc.read_file(out_file))
      assert.are.equal("ran\nrc=0\n", proc.read_file(out_file))
    end)

    it("gives up after its 5th failed attempt when the nodes cannot be reached (69)", function()
      local out, rc = sh(("timeout 30 %s exec --policy examples/jobs/backoff_policy.lua"
        .. " --servers redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3 examples:down -- echo ran")
        :format(q(BIN)))
      assert.are.equal(69, rc, out)
      assert.matches("cannot lock 'examples:down': unavailable", out, 1, true)
      assert.is_nil(out:find("ran", 1, true), out)
    end)
  end)

  describe("nginx/", function()
    local pid, out_file

    after_each(function()
      if pid then proc.stop(pid) end
    end)

    it("examples/nginx/run starts nginx.conf against redlock dev nodes; requests lock; it stops it all", function()
      local port = nginx.free_port()
      out_file = TMP .. "/nginx-run.out"
      -- the one command, with nothing configured: it starts its own nodes
      pid = proc.spawn({ "env", "-u", "REDLOCK_SERVERS", "REDLOCK_BUILD_DIR=" .. proc.build,
        EXAMPLES .. "/nginx/run", tostring(port) }, { out = out_file })
      local out
      local deadline = proc.now_ms() + 30000
      repeat
        out = proc.read_file(out_file) or ""
        if out:find("try: curl", 1, true) or not proc.alive(pid) then break end
        proc.sleep_ms(50)
      until proc.now_ms() > deadline
      assert.matches("nginx %(pid %d+%) on http://127.0.0.1:" .. port .. "/", out)
      local servers = assert(out:match("REDLOCK_SERVERS=(%S+)\n"), out)
      local master = tonumber(out:match("nginx %(pid (%d+)%)"))
      local prefix = out:match(", prefix (%S+)\n")
      local urls = {}
      for u in servers:gmatch("[^,]+") do urls[#urls + 1] = u end
      assert.are.equal(3, #urls, out)

      local function log() return out .. "\n" .. (proc.read_file(prefix .. "/logs/error.log") or "") end
      local status, body = nginx.request(port, "/orders?id=42")
      assert.are.equal(200, status, tostring(body) .. log())
      assert.matches("^order 42 handled under lock %x+ %(valid %d+ ms%)\n$", body)
      -- the README's old snippet answered 500 without ?id=
      status, body = nginx.request(port, "/orders")
      assert.are.equal(400, status, tostring(body) .. log())

      -- a real lock on the nodes the script started: held elsewhere, the
      -- request waits its 2 s and answers 409; released, it goes through
      local dlm = redlock.new { servers = urls }
      local held = assert(dlm:lock("orders:43", { ttl = 30000 }))
      status, body = nginx.request(port, "/orders?id=43")
      assert.are.equal(409, status, tostring(body) .. log())
      assert.are.equal("orders:43: busy\n", body)
      assert(held:unlock())
      status, body = nginx.request(port, "/orders?id=43")
      assert.are.equal(200, status, tostring(body) .. log())
      dlm:close()
      -- the requests' locks were released on every node
      local ports = {}
      for i, u in ipairs(urls) do ports[i] = tonumber(u:match(":(%d+)$")) end
      local function keys_left()
        local left = ""
        for _, p in ipairs(ports) do
          left = left .. proc.sh(("redis-cli -p %d --scan --pattern 'orders:*'"):format(p))
        end
        return left
      end
      local left_deadline = proc.now_ms() + 5000 -- a release's last node may answer after the response
      while keys_left() ~= "" and proc.now_ms() < left_deadline do proc.sleep_ms(50) end
      assert.are.equal("", keys_left())

      -- SIGTERM: nginx, the nodes and the prefix are gone
      proc.kill(pid, "TERM")
      assert.is_true(proc.wait_gone(pid, 15000), proc.read_file(out_file))
      pid = nil
      assert.is_true(proc.wait_gone(master, 5000), "nginx master still running")
      assert.is_false(proc.exists(prefix), "the prefix was left behind")
      for _, p in ipairs(ports) do
        local _, rc = proc.sh(("redis-cli -p %d PING"):format(p))
        assert.are_not.equal(0, rc, "the node on port " .. p .. " still answers")
      end
    end)
  end)
end)
