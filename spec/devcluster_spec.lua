-- redlock.devcluster: throwaway local clusters (used by the specs and by
-- `redlock dev` / `redlock demo`), started on free ports, stopped by pid.

local devcluster = require "redlock.devcluster"
local proc = require "helpers.proc"

local function is_dir(path)
  return os.execute("test -d " .. proc.quote(path)) == 0 or
    os.execute("test -d " .. proc.quote(path)) == true
end

describe("redlock.devcluster", function()
  local cl

  after_each(function()
    if cl then cl:stop() end
    cl = nil
  end)

  it("starts n nodes on distinct free loopback ports that answer PING", function()
    cl = devcluster.start { n = 3 }
    assert.equal(3, #cl.urls)
    local seen = {}
    for i = 1, 3 do
      assert.equal("redis://127.0.0.1:" .. cl.ports[i], cl.urls[i])
      assert.is_nil(seen[cl.ports[i]])
      seen[cl.ports[i]] = true
      assert.is_true(cl:alive(i))
      assert.equal("PONG", (cl:cli(i, "PING")))
      -- no persistence
      assert.equal("save", (cl:cli(i, "CONFIG", "GET", "save"))) -- empty value
      assert.equal("no", (cl:cli(i, "CONFIG", "GET", "appendonly")):match("\n(.*)$"))
    end
    assert.is_true(is_dir(cl.dir))
  end)

  it("stops every node by pid, removes its temporary directory, and may be stopped twice", function()
    cl = devcluster.start { n = 2 }
    local pids, dir = { cl.pids[1], cl.pids[2] }, cl.dir
    assert.is_true(cl:stop())
    for _, pid in ipairs(pids) do assert.is_false(proc.alive(pid)) end
    assert.is_false(is_dir(dir))
    assert.is_true(cl:stop())
  end)

  it("stops a node that was stopped with SIGSTOP", function()
    cl = devcluster.start { n = 1 }
    local pid = cl.pids[1]
    assert.is_true(cl:kill(1, "STOP"))
    assert.is_true(cl:stop())
    assert.is_false(proc.alive(pid))
  end)

  it("kills and restarts a node on the same port", function()
    cl = devcluster.start { n = 2 }
    local port, old = cl.ports[1], cl.pids[1]
    assert.is_true(cl:kill(1, "KILL"))
    assert.is_true(proc.wait_gone(old, 2000))
    assert.is_false(cl:alive(1))
    local out, ok = cl:cli(1, "PING")
    assert.is_false(ok)
    assert.matches("refused", out)
    cl:restart(1)
    assert.equal(port, cl.ports[1])
    assert.are_not.equal(old, cl.pids[1])
    assert.is_true(cl:alive(1))
    assert.equal("PONG", (cl:cli(1, "PING")))
  end)

  it("signals by name or number and rejects unknown signals and nodes", function()
    cl = devcluster.start { n = 1 }
    assert.is_true(cl:kill(1, "STOP"))
    assert.is_true(cl:kill(1, 18)) -- SIGCONT
    assert.equal("PONG", (cl:cli(1, "PING")))
    assert.has_error(function() cl:kill(1, "NOPE") end)
    assert.has_error(function() cl:kill(2, "TERM") end)
    assert.has_error(function() cl:cli(0, "PING") end)
  end)

  it("passes arguments to redis-server verbatim and quotes them for the shell", function()
    cl = devcluster.start { n = 1, args = { "--maxmemory", "7mb" } }
    assert.equal("7340032", (cl:cli(1, "CONFIG", "GET", "maxmemory")):match("\n(.*)$"))
    assert.equal("OK", (cl:cli(1, "SET", "it's a key", "x y")))
    assert.equal("x y", (cl:cli(1, "GET", "it's a key")))
  end)

  it("runs a node under opts.wrap's command prefix, also after a restart", function()
    assert.has_error(function() devcluster.start { wrap = "env" } end)
    local dir = proc.tmpdir()
    local mark = dir .. "/it's wrapped"
    -- sh -c SCRIPT sh redis-server ARGS...: the script runs, then execs the node
    cl = devcluster.start { n = 2, wrap = { [2] = { "sh", "-c", 'echo "$1" >> "$0.tmp"; exec "$@"', mark } } }
    assert.matches("%S\n$", proc.read_file(mark .. ".tmp") or "") -- the server it then ran
    os.remove(mark .. ".tmp")
    assert.is_true(cl:kill(2, "KILL"))
    cl:restart(2)
    assert.matches("%S\n$", proc.read_file(mark .. ".tmp") or "") -- the server it then ran
    assert.equal("PONG", (cl:cli(2, "PING")))
    proc.rmdir(dir)
  end)

  it("starts nodes with a password and puts it in the URLs and cli()", function()
    cl = devcluster.start { n = 2, password = "s3cret" }
    assert.equal("redis://:s3cret@127.0.0.1:" .. cl.ports[1], cl.urls[1])
    assert.equal("PONG", (cl:cli(1, "PING")))
    local out = io.popen("redis-cli -p " .. cl.ports[1] .. " PING 2>&1"):read("*a")
    assert.matches("NOAUTH", out)
  end)

  it("uses a given directory and leaves it in place", function()
    local dir = proc.tmpdir()
    cl = devcluster.start { n = 1, dir = dir }
    assert.equal(dir, cl.dir)
    assert.is_truthy(proc.read_file(dir .. "/redis-" .. cl.ports[1] .. ".log"))
    cl:stop()
    cl = nil
    assert.is_true(is_dir(dir))
    proc.rmdir(dir)
  end)

  it("raises with the node's log when redis-server refuses to start", function()
    local ok, e = pcall(devcluster.start, { n = 1, args = { "--no-such-option", "1" } })
    assert.is_false(ok)
    assert.matches("devcluster", e)
    assert.matches("no-such-option", e, 1, true)
  end)

  it("rejects bad options", function()
    assert.has_error(function() devcluster.start { n = 0 } end)
    assert.has_error(function() devcluster.start { n = 1.5 } end)
    assert.has_error(function() devcluster.start { args = "--port 1" } end)
    assert.has_error(function() devcluster.start { password = "" } end)
  end)

  -- Before: only known fields were checked. start { nodes = 1 } and
  -- start { n = 1, pasword = "x" } launched nodes (5 of them, no password),
  -- args = { 5 } and dir = 5 went unchecked, and wrap = { [1] = "env" }
  -- raised from inside the module (ipairs on a string).
  it("refuses unknown fields and fields of the wrong type, naming them, before starting anything", function()
    local function refused(opts, field)
      local ok, e = pcall(devcluster.start, opts)
      assert.is_false(ok, "started with " .. field)
      assert.is_string(e)
      assert.matches("bad argument #1 to 'start' (", e, 1, true)
      assert.matches(field, e, 1, true)
    end
    refused({ nodes = 1 }, "unknown field nodes")
    refused({ n = 1, pasword = "x" }, "unknown field pasword")
    refused({ n = 1, [1] = 3 }, "unknown field 1")
    refused({ n = 1, args = { 5 } }, "opts.args")
    refused({ n = 1, args = { "--maxmemory", "1mb", x = "y" } }, "opts.args")
    refused({ n = 1, dir = 5 }, "opts.dir")
    refused({ n = 1, dir = "" }, "opts.dir")
    refused({ n = 1, wrap = { [1] = "env" } }, "opts.wrap[1]")
    refused({ n = 1, wrap = { [1] = { "env", 5 } } }, "opts.wrap[1]")
    refused({ n = 1, wrap = { [2] = { "env" } } }, "opts.wrap: a key must be a node index 1..1, got 2")
    refused({ n = 2, wrap = { x = { "env" } } }, "opts.wrap: a key must be a node index 1..2, got x")
  end)

  describe("with opts.tls", function()
    local tls = require "helpers.tls"
    teardown(function() tls.cleanup() end)

    it("serves TLS only, on rediss:// urls, and cli(), kill() and restart() work over it", function()
      local pki = tls.make()
      cl = devcluster.start { n = 2, tls = { cert = pki.server_cert, key = pki.server_key, ca = pki.ca } }
      for i = 1, 2 do
        assert.equal("rediss://127.0.0.1:" .. cl.ports[i], cl.urls[i])
        assert.equal("PONG", (cl:cli(i, "PING")))
        assert.equal("0", (cl:cli(i, "CONFIG", "GET", "port")):match("\n(.*)$"))
      end
      -- a plain client on the TLS port gets no answer
      local out = io.popen("redis-cli -h 127.0.0.1 -p " .. cl.ports[1] .. " PING 2>&1"):read("*a")
      assert.not_matches("PONG", out)
      local old = cl.pids[1]
      assert.is_true(cl:kill(1, "KILL"))
      assert.is_true(proc.wait_gone(old, 2000))
      cl:restart(1)
      assert.equal("PONG", (cl:cli(1, "PING")))
    end)

    it("requires client certificates with auth_clients = \"yes\", and cli() presents one", function()
      local pki = tls.make()
      cl = devcluster.start { n = 1, tls = {
        cert = pki.server_cert, key = pki.server_key, ca = pki.ca, auth_clients = "yes",
        client_cert = pki.client_cert, client_key = pki.client_key } }
      assert.equal("PONG", (cl:cli(1, "PING")))
      local out = io.popen("redis-cli --tls --cacert " .. proc.quote(pki.ca) .. " -h 127.0.0.1 -p "
        .. cl.ports[1] .. " PING 2>&1"):read("*a")
      assert.not_matches("PONG", out)
    end)

    it("rejects bad tls options", function()
      local pki = tls.make()
      assert.has_error(function() devcluster.start { n = 1, tls = "yes" } end)
      assert.has_error(function() devcluster.start { n = 1, tls = { cert = pki.server_cert, key = pki.server_key } } end)
      assert.has_error(function() devcluster.start { n = 1, tls = {
        cert = pki.server_cert, key = pki.server_key, ca = pki.ca, auth_clients = "maybe" } } end)
      assert.has_error(function() devcluster.start { n = 1, tls = {
        cert = pki.server_cert, key = pki.server_key, ca = pki.ca, auth_clients = "yes" } } end)
      assert.has_error(function() devcluster.start { n = 1, tls = {
        cert = pki.server_cert, key = pki.server_key, ca = pki.ca, bogus = 1 } } end)
    end)
  end)

  it("loads in plain luajit with only lua/ on the path", function()
    local cmd = [[luajit -e 'package.path="lua/?.lua;lua/?/init.lua"; package.cpath="";
      local dc = require "redlock.devcluster"; local c = dc.start{ n = 1 };
      local pong = c:cli(1, "PING"); c:stop(); print(pong)' 2>&1]]
    local out = io.popen(cmd):read("*a")
    assert.equal("PONG\n", out)
  end)
end)
