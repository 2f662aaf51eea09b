-- The library leaves signal dispositions as it found them (docs/c-api.md):
-- a client that has locked and unlocked leaves SIGPIPE at SIG_DFL in the
-- process and in every child the process starts afterwards. A write to a node
-- that has closed its socket fails with EPIPE (send with MSG_NOSIGNAL); it
-- never raises SIGPIPE. The children run spec/helpers/sigpipe.lua.

local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local res = cluster.names("signals")

local ROOT = io.popen("pwd"):read("*l")
local HELPER = ROOT .. "/spec/helpers/sigpipe.lua"
local HOST = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if HOST:sub(1, 1) ~= "/" then HOST = ROOT .. "/" .. HOST end

--- Run the helper under plain luajit with this spec's module paths; return
-- its output (stderr merged) and exit status.
local function luajit(args)
  local words = {}
  for i, a in ipairs(args) do words[i] = q(a) end
  return proc.sh(("env LUA_PATH=%s LUA_CPATH=%s luajit %s %s"):format(
    q(package.path), q(package.cpath), q(HELPER), table.concat(words, " ")))
end

local function fields(out)
  local t = {}
  for k, v in out:gmatch("([%w_]+)=(%d+)") do t[k] = tonumber(v) end
  return t
end

describe("SIGPIPE", function()
  local cl

  setup(function()
    cl = cluster.start(3)
  end)

  teardown(function()
    cluster.stop_all()
  end)

  describe("in plain LuaJIT", function()
    it("stays at its default disposition after a lock and unlock, in the process and in its children", function()
      local out, rc = luajit { "dispositions", res("plain"), unpack(cl.urls) }
      assert.are.equal(0, rc, out)
      local f = fields(out)
      assert.are.equal(0, f.start, "SIGPIPE ignored before redlock was loaded:\n" .. out)
      assert.are.equal(0, f.self, "the process ignores SIGPIPE after using redlock:\n" .. out)
      assert.are.equal(0, f.popen, "an io.popen child ignores SIGPIPE:\n" .. out)
      assert.are.equal(0, f.execute, "an os.execute child ignores SIGPIPE:\n" .. out)
      assert.are.equal(141, f.yes, "`yes | head -1` did not end yes with SIGPIPE:\n" .. out)
    end)

    -- A unix socket whose peer has closed fails the next write with EPIPE,
    -- the write that raises SIGPIPE without MSG_NOSIGNAL, as long as the peer
    -- had read everything (else the write fails with ECONNRESET, no signal):
    -- with the batch still queued at the kill, that write is certain.
    it("survives writing a batch to a node killed with the batch queued (unix sockets)", function()
      local dir, nodes, urls = proc.tmpdir(), {}, {}
      finally(function()
        for _, n in ipairs(nodes) do n:stop() end
        proc.rmdir(dir)
      end)
      for i = 1, 3 do
        local path = ("%s/node%d.sock"):format(dir, i)
        nodes[i] = cluster.start(1, { args = { "--unixsocket", path, "--unixsocketperm", "700" } })
        urls[i] = "unix://" .. path
      end
      local out, rc = luajit { "survive", "queued", tostring(nodes[1].pids[1]), res("unix"), unpack(urls) }
      assert.are.equal(0, rc, "the process did not survive (141 is SIGPIPE):\n" .. out)
      assert.are.same({ done = 400, ok = 200, node1_ok = 0 }, fields(out))
    end)

    it("survives a node killed while a batch was in flight (TCP)", function()
      local nodes = cluster.start(3)
      finally(function() nodes:stop() end)
      local out, rc = luajit { "survive", "written", tostring(nodes.pids[1]), res("tcp"), unpack(nodes.urls) }
      assert.are.equal(0, rc, "the process did not survive (141 is SIGPIPE):\n" .. out)
      assert.are.same({ done = 400, ok = 200, node1_ok = 0 }, fields(out))
    end)
  end)

  describe("in the redlock host", function()
    it("is back at its default disposition in the children a script starts", function()
      assert(io.open(HOST, "rb"), HOST .. " is not built (cmake -S . -B build && cmake --build build)"):close()
      local out, rc = proc.sh(("%s run %s dispositions %s %s"):format(q(HOST), q(HELPER),
        q(res("host")), table.concat(cl.urls, " ")))
      assert.are.equal(0, rc, out)
      local f = fields(out)
      -- The host catches SIGPIPE for itself (a handler, not SIG_IGN), and a
      -- caught signal is back at SIG_DFL after execve.
      assert.are.equal(0, f.self, out)
      assert.are.equal(0, f.popen, "an io.popen child ignores SIGPIPE:\n" .. out)
      assert.are.equal(0, f.execute, "an os.execute child ignores SIGPIPE:\n" .. out)
      assert.are.equal(141, f.yes, "`yes | head -1` did not end yes with SIGPIPE:\n" .. out)
    end)
  end)
end)
