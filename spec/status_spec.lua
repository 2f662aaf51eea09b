-- `redlock status` says who holds what: the holder's label carried in the
-- lock value (HOST:PID for a holder started by redlock, a Lua client's own
-- label option), its fencing token and how long a quorum still holds it;
-- without RESOURCE, every node's state and latency. Real binary, real
-- redis-server nodes. The binary is build/redlock, or $REDLOCK_HOST.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local ROOT = proc.root
local BIN = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end

local res = cluster.names("status")

describe("redlock status", function()
  local cl, tmp, servers
  setup(function()
    cl = cluster.start(3)
    tmp = proc.tmpdir()
    servers = table.concat(cl.urls, ",")
  end)
  teardown(function()
    cluster.stop_all()
    proc.rmdir(tmp)
  end)

  local function status(args)
    return proc.sh(("%s status --servers %s %s"):format(q(BIN), q(servers), args or ""))
  end

  it("shows the label HOST:PID and the token of a holder started with redlock exec --fence", function()
    local r = res("fenced")
    -- a token taken before, so that the holder's is not 1
    local dlm = redlock.new { servers = cl.urls }
    assert(dlm:lock(r, { fence = true, ttl = 5000 })):unlock()
    local out_file = tmp .. "/exec.env"
    local pid = proc.spawn({ BIN, "exec", "--fence", "--servers", servers, r, "--", "sh", "-c",
      "echo $REDLOCK_TOKEN $REDLOCK_VALUE > " .. q(out_file .. ".tmp") .. "; mv " .. q(out_file .. ".tmp") .. " "
        .. q(out_file) .. "; sleep 30" })
    finally(function() proc.stop(pid) end)
    local token, value = proc.wait_file(out_file, 10000):match("^(%d+) (%S+)")
    assert.equals("2", token)
    local label = value:match("^(.-)/")
    -- the host's own pid, after the host name
    assert.matches(":" .. pid .. "$", label)
    assert.is_true(#label <= 15)
    local out, rc = status(q(r))
    assert.equals(0, rc, out)
    for i = 1, 3 do
      assert.matches(("%d  %s%%s+held%%s+%s%%.%%.%%.%%s+pttl %%d+ ms  label %s  fence 2"):format(i,
        cl.urls[i]:gsub("%p", "%%%0"), value:sub(1, 12):gsub("%p", "%%%0"), label:gsub("%p", "%%%0")), out)
    end
    assert.matches("holder '" .. label .. "', fencing token 2, quorum held for %d+ ms more", out)
    dlm:close()
  end)

  it("shows the label a Lua client chose, and no token for a plain lock", function()
    local r = res("lua")
    local dlm = redlock.new { servers = cl.urls, label = "billing-7" }
    local lk = assert(dlm:lock(r, { ttl = 20000 }))
    local out, rc = status(q(r))
    assert.equals(0, rc, out)
    assert.matches("label billing-7", out, 1, true)
    assert.matches("holder 'billing%-7', fencing token none, quorum held for %d+ ms more", out)
    local left = tonumber(out:match("quorum held for (%d+) ms"))
    assert.is_true(left > 10000 and left <= 20000, out)
    lk:unlock()
    out, rc = status(q(r))
    assert.equals(1, rc, out)
    assert.matches("free: no node holds", out, 1, true)
    dlm:close()
  end)

  -- Before: the token was the highest counter among the holders (a node
  -- whose grant came after the decision counts higher than the token), a
  -- key without expiry counted as the shortest time to live, and a value's
  -- control bytes went to the terminal as they were.
  it("shows the token a quorum committed, counts no expiry as the longest, and escapes control bytes", function()
    local r = res("forged")
    local value = "w\27[2K\rx:1/0123456789abcdef0123456789abcdef012345"
    for i, node in ipairs { { 5000, 6 }, { 9000, 6 }, { nil, 101 } } do
      if node[1] then cl:cli(i, "SET", r, value, "PX", tostring(node[1]))
      else cl:cli(i, "SET", r, value) end
      cl:cli(i, "SET", r .. ":fence", tostring(node[2]))
    end
    local out, rc = status(q(r))
    -- no quorum of the holders agrees on a counter: a commit that is missing
    for i, n in ipairs { 5, 6, 7 } do cl:cli(i, "SET", r .. ":fence", tostring(n)) end
    local unsure = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", r, r .. ":fence") end
    assert.equals(0, rc, out)
    assert.matches("fencing token 6,", out, 1, true)
    assert.matches("fencing token unknown,", unsure, 1, true)
    local left = tonumber(out:match("quorum held for (%d+) ms"))
    assert.is_true(left ~= nil and left > 5000 and left <= 9000, out)
    assert.is_nil(out:find("\27", 1, true), out)
    assert.matches("w\\x1b[2K\\x0dx", out, 1, true)
  end)

  -- Before: the summary compared the vote of a value longer than the probe
  -- keeps (its first bytes and its length) with the nodes' values: no label,
  -- no token, and "quorum held for ever (no expiry!)" for a key expiring.
  it("tells the holder, token and time left of a value longer than 127 bytes", function()
    local r = res("long")
    local value = "w1/" .. ("0123456789abcdef"):rep(9):sub(1, 140)
    for i = 1, 3 do
      cl:cli(i, "SET", r, value, "PX", "60000")
      cl:cli(i, "SET", r .. ":fence", "5")
    end
    local out, rc = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", r, r .. ":fence") end
    assert.equals(0, rc, out)
    assert.matches("held: value w1/012345678... on 3 of 3 nodes (quorum 2)", out, 1, true)
    assert.matches("holder 'w1', fencing token 5, quorum held for %d+ ms more", out)
    local left = tonumber(out:match("quorum held for (%d+) ms"))
    assert.is_true(left > 50000 and left <= 60000, out)
  end)

  -- Before: the summary printed a counter that was no decimal integer as
  -- the token, raw: " \r\t\n 0x1b" (tonumber takes blanks and hex).
  it("takes only a decimal counter for a token, and escapes what the nodes hold", function()
    local r = res("esc")
    for i = 1, 3 do
      cl:cli(i, "SET", r, "lab/abcdef", "PX", "60000")
      cl:cli(i, "SET", r .. ":fence", " \r\t\n 0x1b")
    end
    local out, rc = status(q(r))
    for i = 1, 3 do cl:cli(i, "SET", r .. ":fence", "0x1b") end
    local hex = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", r, r .. ":fence") end
    assert.equals(0, rc, out)
    assert.is_nil(out:find("[\r\t]"), out)
    assert.matches("fence  \\x0d\\x09\\x0a 0x1b", out, 1, true)
    assert.matches("holder 'lab', fencing token unknown, quorum held for %d+ ms more", out)
    assert.matches("holder 'lab', fencing token unknown, quorum held for %d+ ms more", hex)
  end)

  -- Before: any run of digits was the token ("fencing token 0", "00042",
  -- "99999999999999999999", none of which the engine takes), and a counter
  -- longer than 23 bytes was cut there without a sign: a 30-digit counter
  -- showed as the token "12345678901234567890123".
  it("takes a counter for a token only as the engine does, and marks a counter it cut", function()
    local r = res("token_rule")
    local function token_with(counter)
      for i = 1, 3 do
        cl:cli(i, "SET", r, "lab/abcdef", "PX", "60000")
        cl:cli(i, "SET", r .. ":fence", counter)
      end
      local out, rc = status(q(r))
      for i = 1, 3 do cl:cli(i, "DEL", r, r .. ":fence") end
      assert.equals(0, rc, out)
      return out:match("fencing token (%S+),"), out
    end
    local thirty = "123456789012345678901234567890"
    for _, counter in ipairs { "0", "00042", "-5", "+7", "9223372036854775808", "99999999999999999999", thirty } do
      assert.equals("unknown", (token_with(counter)), counter)
    end
    assert.equals("9223372036854775807", (token_with("9223372036854775807")))
    assert.equals("42", (token_with("42")))
    local _, out = token_with(thirty)
    for i = 1, 3 do
      assert.matches(("%d  %s%%s+held .*  fence 12345678901234567890123%%.%%.%%.\n"):format(i,
        cl.urls[i]:gsub("%p", "%%%0")), out)
    end
  end)

  -- Before: GET of a counter of another type answered WRONGTYPE, and the
  -- node counted as unreachable: a plain lock held on every node read
  -- "unknown: only 1 of 3 nodes answered", exit 69.
  it("counts a node whose counter is of another type as answering, the token unknown", function()
    local r = res("wrongtype")
    for i = 1, 3 do cl:cli(i, "SET", r, "lab/abcdef", "PX", "60000") end
    for i = 1, 2 do cl:cli(i, "RPUSH", r .. ":fence", "x") end
    local out, rc = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", r, r .. ":fence") end
    assert.equals(0, rc, out)
    for i = 1, 2 do
      assert.matches(("%d  %s%%s+held%%s+lab/abcdef%%s+pttl %%d+ ms  label lab  fence not a string\n"):format(i,
        cl.urls[i]:gsub("%p", "%%%0")), out)
    end
    assert.matches("held: value lab/abcdef... on 3 of 3 nodes (quorum 2)", out, 1, true)
    assert.matches("holder 'lab', fencing token unknown, quorum held for %d+ ms more", out)
  end)

  -- Before: a value longer than the probe keeps was told apart by its
  -- first 127 bytes and its length only: two holders counted as one, and
  -- "held" (exit 0) with no value on a quorum.
  it("tells apart two values longer than 127 bytes that differ past them", function()
    local r = res("long_two")
    local head = "lab/" .. ("a"):rep(199)
    cl:cli(1, "SET", r, head .. "1", "PX", "60000")
    cl:cli(2, "SET", r, head .. "2", "PX", "60000")
    local out, rc = status(q(r))
    cl:cli(3, "SET", r, head .. "1", "PX", "60000")
    local held, hrc = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", r) end
    assert.equals(1, rc, out)
    assert.matches("not held: at most 1 of 3 nodes agree on a value (quorum 2)", out, 1, true)
    assert.equals(0, hrc, held)
    assert.matches("held: value lab/aaaaaaaa... on 2 of 3 nodes (quorum 2)", held, 1, true)
  end)

  -- Before: slot values went to the terminal as they were, control bytes
  -- and all.
  it("escapes control bytes in the slots of status --limit", function()
    local r = res("slots")
    for i = 1, 3 do cl:cli(i, "SET", "redlock:slot:1:" .. r, "ev\27[31mil\n/abc", "PX", "60000") end
    local out, rc = status("--limit 2 " .. q(r))
    for i = 1, 3 do cl:cli(i, "DEL", "redlock:slot:1:" .. r) end
    assert.equals(0, rc, out)
    assert.is_nil(out:find("\27", 1, true), out)
    assert.matches("slot 1   ev\\x1b[31mil\\x0a/a... on 3 of 3 nodes", out, 1, true)
  end)

  -- Before: only slot 1 was looked at, so a semaphore whose holders had
  -- taken other slots (a holder's slot is drawn at random) showed as free
  -- with no word of a semaphore.
  it("says a free RESOURCE looks like a semaphore when a slot other than the first is held", function()
    local r = res("slot3")
    for i = 1, 3 do cl:cli(i, "SET", "redlock:slot:3:" .. r, ("%040x"):format(7), "PX", "60000") end
    local out, rc = status(q(r))
    for i = 1, 3 do cl:cli(i, "DEL", "redlock:slot:3:" .. r) end
    assert.equals(1, rc, out)
    assert.matches("looks like a semaphore (its slot 3 is held): redlock status --limit L", out, 1, true)
  end)

  -- Mark RESOURCE as held shared on every node by the holders values (each
  -- with a minute left), as redlock exec --shared leaves it.
  local function share(r, values)
    local until_ms = tostring(os.time() * 1000 + 60000)
    for i = 1, 3 do
      cl:cli(i, "SET", r, "redlock:shared", "PX", "60000")
      local args = {}
      for _, v in ipairs(values) do args[#args + 1] = until_ms; args[#args + 1] = v end
      cl:cli(i, "ZADD", "redlock:readers:" .. r, unpack(args))
    end
  end
  local function unshare(r)
    for i = 1, 3 do cl:cli(i, "DEL", r, "redlock:readers:" .. r) end
  end

  -- Before: a shared holder's value went to the terminal as it was.
  it("escapes control bytes in the shared holders' values", function()
    local r = res("shared_esc")
    share(r, { "x\27[2Jy" })
    local out, rc = status(q(r))
    unshare(r)
    assert.equals(0, rc, out)
    assert.is_nil(out:find("\27", 1, true), out)
    assert.matches("\n  x\\x1b[2Jy...  on 3 nodes", out, 1, true)
  end)

  -- Before: each node listed its first 16 shared holders only, and the
  -- summary counted those: "20 shared holders" on every node, but "held
  -- shared: 16 holders on a quorum".
  it("counts every shared holder up to the list's cap, and says 'at least' past it", function()
    local r = res("many")
    local values = {}
    for k = 1, 20 do values[k] = ("reader-%02d/0123456789abcdef0123456789abcs"):format(k) end
    share(r, values)
    local out, rc = status(q(r))
    assert.equals(0, rc, out)
    for i = 1, 3 do
      assert.matches(("%d  %s%%s+read%%s+20 shared holders"):format(i, cl.urls[i]:gsub("%p", "%%%0")), out)
    end
    assert.matches("held shared: 20 holders on a quorum; the mark on 3 of 3 nodes (quorum 2)", out, 1, true)
    local _, listed = out:gsub("\n  reader%-%d%d/01%.%.%.  on 3 nodes", "")
    assert.equals(20, listed, out)
    -- past the cap (64 a node): the count is a floor, and status says so
    for k = 21, 70 do values[k] = ("reader-%02d/0123456789abcdef0123456789abcs"):format(k) end
    share(r, values)
    out, rc = status(q(r))
    unshare(r)
    assert.equals(0, rc, out)
    assert.matches("read%s+70 shared holders", out)
    assert.matches("held shared: at least 64 holders on a quorum (each node's list cut at 64, those expiring "
      .. "first; up to 70 on a node); the mark on 3 of 3 nodes (quorum 2)", out, 1, true)
    assert.matches("\n  ... and up to 6 more a node, not listed\n", out, 1, true)
  end)

  -- Before: the same server under two spellings counted twice: "held on 2
  -- of 3 nodes" for a key on one server, and exit 0.
  it("counts a server named twice once, and says so", function()
    local r = res("twice")
    cl:cli(1, "SET", r, "me:1/0123456789abcdef0123456789abcdef0123", "PX", "20000")
    local alias = cl.urls[1]:gsub("127%.0%.0%.1", "127.1")
    local list = q(table.concat({ cl.urls[1], alias, cl.urls[2] }, ","))
    local out, rc = proc.sh(("%s status --servers %s %s"):format(q(BIN), list, q(r)))
    cl:cli(1, "DEL", r)
    assert.equals(1, rc, out)
    assert.matches("2  " .. alias .. "%s+error  same server as node 1 %(run_id %x+%.%.%.%)", out)
    assert.matches("not held: at most 1 of 3 nodes agree", out, 1, true)
    out, rc = proc.sh(("%s status --servers %s"):format(q(BIN), list))
    assert.equals(0, rc, out)
    assert.matches("up: 2 of 3 nodes answer (quorum 2)", out, 1, true)
  end)

  -- Before: status read 'redlock:xr' for REDLOCK_PREFIX=redlock:x, and
  -- passed over a --cacert file that is not there; exec and run refuse both.
  it("refuses a reserved prefix and a TLS file that is not there, as exec and run do (64)", function()
    local out, rc = proc.sh(("env REDLOCK_PREFIX=redlock:x %s status --servers %s r"):format(q(BIN), q(servers)))
    assert.equals(64, rc, out)
    assert.matches("REDLOCK_PREFIX 'redlock:x' starts with \"redlock:\"", out, 1, true)
    out, rc = status("--cacert /nonexistent/ca.pem r")
    assert.equals(64, rc, out)
    assert.matches("--cacert '/nonexistent/ca.pem': No such file or directory", out, 1, true)
    out, rc = status("--cacert /nonexistent/ca.pem")
    assert.equals(64, rc, out)
    -- the client's own check of the files, not a look of status' own (which took a directory)
    out, rc = status("--cacert " .. q(tmp) .. " r")
    assert.equals(64, rc, out)
    assert.matches("--cacert '" .. tmp .. "': is a directory", out, 1, true)
  end)

  it("without RESOURCE shows every node's state and latency", function()
    local out, rc = status()
    assert.equals(0, rc, out)
    assert.matches("3 nodes, quorum 2", out, 1, true)
    for i = 1, 3 do
      assert.matches(("%d  %s%%s+up%%s+%%d+%%.%%d ms"):format(i, cl.urls[i]:gsub("%p", "%%%0")), out)
    end
    assert.matches("up: 3 of 3 nodes answer (quorum 2)", out, 1, true)
    -- two nodes stopped: down, exit 69, and the stopped ones say why
    assert(cl:kill(2, "STOP"))
    assert(cl:kill(3, "STOP"))
    out, rc = status()
    assert(cl:kill(2, "CONT"))
    assert(cl:kill(3, "CONT"))
    assert.equals(69, rc, out)
    assert.matches("2  " .. cl.urls[2] .. "  error  PING: no answer within 500 ms", out, 1, true)
    assert.matches("down: 1 of 3 nodes answer (quorum 2)", out, 1, true)
  end)

  -- Before: the nodes were asked one after another, each given 500 ms: five
  -- stopped nodes made `redlock status` wait 2.5 s at least. Asked at once,
  -- they share one 500 ms (the bound below leaves room for a slow start).
  it("asks every node at once: stopped nodes cost one timeout between them", function()
    local five = cluster.start(5)
    finally(function() five:stop() end)
    for i = 1, 5 do assert(five:kill(i, "STOP")) end
    local list = q(table.concat(five.urls, ","))
    local t0 = proc.now_ms()
    local out, rc = proc.sh(("%s status --servers %s %s"):format(q(BIN), list, q(res("stopped"))))
    local with_key_ms = proc.now_ms() - t0
    t0 = proc.now_ms()
    local pings, prc = proc.sh(("%s status --servers %s"):format(q(BIN), list))
    local ping_ms = proc.now_ms() - t0
    for i = 1, 5 do assert(five:kill(i, "CONT")) end
    assert.equals(69, rc, out)
    assert.equals(69, prc, pings)
    for i = 1, 5 do
      assert.matches(("%d  %s  error  [%%w ]+: no answer within 500 ms"):format(i, five.urls[i]:gsub("%p", "%%%0")), out)
      assert.matches(("%d  %s  error  PING: no answer within 500 ms"):format(i, five.urls[i]:gsub("%p", "%%%0")), pings)
    end
    assert.is_true(with_key_ms < 2000, ("%.0f ms:\n%s"):format(with_key_ms, out))
    assert.is_true(ping_ms < 2000, ("%.0f ms:\n%s"):format(ping_ms, pings))
  end)
end)
