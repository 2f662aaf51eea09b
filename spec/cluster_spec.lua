-- A node that is a Redis Cluster (docs/cluster.md): one vote, the vote of
-- the master serving the resource's hash slot. Three clusters of three
-- masters each (spec/helpers/rcluster.lua), formed once for the file, and
-- two plain nodes for the mixed list.

local redlock = require "redlock"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("cluster")

--- Names whose hash slots are served by each master of c in turn (a
--- name per master, so every shard of a cluster node is used).
local function names_on_every_master(c, tag)
  local by, out, n = {}, {}, 0
  while #out < c.n do
    n = n + 1
    local name = res(tag .. n)
    local j = rcluster.owner(c, name)
    if not by[j] then by[j] = true; out[#out + 1] = name end
  end
  return out
end

describe("cluster nodes", function()
  local cs, plain = {}, nil

  lazy_setup(function()
    for i = 1, 3 do cs[i] = rcluster.start(3) end
  end)
  lazy_teardown(function()
    rcluster.stop_all()
    cluster.stop_all()
  end)

  local function client(opts)
    opts = opts or {}
    local servers = {}
    for i = 1, 3 do servers[i] = { cluster = cs[i].seeds } end
    opts.servers = opts.servers or servers
    opts.ttl = opts.ttl or 5000
    opts.node_timeout = opts.node_timeout or 200
    return redlock.new(opts)
  end

  --- Wait (at most 5 s) until every cluster's master for each of names holds it, driving dlm
  --- meanwhile; "" or the ones missing. A call is decided at quorum, and a plain LuaJIT client
  --- serves the rest of it (its tail: here a cluster whose map or connections were not ready
  --- yet, whose SET is still unwritten) only inside its next call (docs/errors.md).
  local function await_everywhere(dlm, names)
    local deadline = proc.now_ms() + 5000
    while true do
      local missing = {}
      for _, name in ipairs(names) do
        for i = 1, 3 do
          if rcluster.cli(cs[i], rcluster.owner(cs[i], name), "GET", name) == "" then
            missing[#missing + 1] = ("cluster %d, %s"):format(i, name)
          end
        end
      end
      if #missing == 0 or proc.now_ms() > deadline then return table.concat(missing, "; ") end
      cluster.drive(dlm)
      proc.sleep_ms(10)
    end
  end

  it("a lock is one vote per cluster: its key on the master serving its slot, and nowhere else", function()
    local dlm = client()
    for _, name in ipairs(names_on_every_master(cs[1], "one")) do
      local lock, err, detail = dlm:lock(name)
      assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
      assert.are.equal("", await_everywhere(dlm, { name }))
      for i = 1, 3 do
        local c, owner = cs[i], rcluster.owner(cs[i], name)
        for j = 1, c.n do
          local v = rcluster.cli(c, j, "GET", name)
          if j == owner then assert.are.equal(lock.value, v) else assert.matches("^MOVED", v) end
        end
      end
      -- a second client is refused by every cluster
      local other = client()
      local l2, err2 = other:try_lock(name)
      assert.is_nil(l2)
      assert.are.equal("busy", err2)
      assert.is_true(lock:unlock())
      for i = 1, 3 do
        assert.are.equal("", rcluster.cli(cs[i], rcluster.owner(cs[i], name), "GET", name))
      end
      other:close()
    end
    dlm:close()
  end)

  it("fencing tokens increase; the counter sits in the key's slot ({name}:fence, {tag}name:fence for a tagged name)", function()
    local dlm = client()
    local tag = res("tag")
    local tagged = "job:{" .. tag .. "}:x"
    local odd = res("odd") .. "}x" -- a '}' without a tag: the counter gets a tag of the same slot
    for _, name in ipairs({ res("fence"), tagged, odd }) do
      local last = 0
      for _ = 1, 3 do
        local lock, err, detail = dlm:lock(name, { fence = true })
        assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
        assert.is_true(tonumber(lock.token) > last)
        last = tonumber(lock.token)
        assert.is_true(lock:unlock())
      end
      assert.are.equal(3, last)
      for i = 1, 3 do
        local c = cs[i]
        local owner = rcluster.owner(c, name)
        local counter
        for _, k in ipairs(rcluster.keys(c, owner)) do
          if k:sub(-6) == ":fence" and k:find(name, 1, true) then counter = k end
        end
        assert.is_truthy(counter, "no counter for " .. name)
        assert.are.equal(rcluster.slot(c, name), rcluster.slot(c, counter))
        if name == tagged then assert.are.equal("{" .. tag .. "}" .. name .. ":fence", counter) end
        if name ~= tagged and name ~= odd then assert.are.equal("{" .. name .. "}:fence", counter) end
        assert.are.equal("3", (rcluster.cli(c, owner, "GET", counter)))
      end
    end
    dlm:close()
  end)

  it("keep-alive extends a lock on every cluster past its ttl, from the keeper's own connections", function()
    -- (a ttl the keeper renews every third of: a loaded machine that holds
    -- the keeper up for two thirds of it loses a key, so not too short)
    local TTL = 1000
    local dlm = client({ ttl = TTL })
    local names = names_on_every_master(cs[1], "keep")
    local group = assert(dlm:lock_many(names, { keepalive = true }))
    -- the keeper extends a key only where the acquire put it: serve the acquire's tail first
    assert.are.equal("", await_everywhere(dlm, names))
    proc.sleep_ms(TTL * 5 / 2)
    assert.is_true(group:valid())
    for _, name in ipairs(names) do
      for i = 1, 3 do
        local owner = rcluster.owner(cs[i], name)
        assert.are_not.equal("", (rcluster.cli(cs[i], owner, "GET", name)), ("cluster %d, %s"):format(i, name))
        local pttl = tonumber((rcluster.cli(cs[i], owner, "PTTL", name)))
        assert.is_true(pttl > 0 and pttl <= TTL, tostring(pttl))
      end
    end
    assert.is_true(group:unlock())
    dlm:close()
  end)

  it("lock_many takes names in different slots, on different masters, all or none", function()
    local dlm = client()
    local names = names_on_every_master(cs[2], "many")
    local group, err, detail = dlm:lock_many(names)
    assert.is_truthy(group, tostring(err) .. " " .. tostring(detail))
    assert.are.equal("", await_everywhere(dlm, names))
    -- one of them held elsewhere: none is taken
    assert.is_true(group:unlock())
    local other = client()
    local blocker = assert(other:try_lock(names[2]))
    local none = dlm:lock_many(names, { retry = function() return nil end })
    assert.is_nil(none)
    assert.are.equal("", rcluster.cli(cs[1], rcluster.owner(cs[1], names[1]), "GET", names[1]))
    blocker:unlock()
    other:close()
    dlm:close()
  end)

  it("wakes a waiter through sharded pub/sub: SPUBLISH on the serving master only, no PUBLISH anywhere", function()
    local before = {}
    for i = 1, 3 do
      before[i] = {}
      for j = 1, 3 do before[i][j] = { rcluster.calls(cs[i], j, "publish"), rcluster.calls(cs[i], j, "spublish") } end
    end
    local name = res("wake")
    local dir = proc.tmpdir()
    local argv = { "luajit", "spec/helpers/holder.lua", name, "700", dir .. "/ready", cs[1].url, cs[2].url, cs[3].url }
    local pid = proc.spawn_luajit(argv, dir .. "/out")
    local dlm = client()
    local ok, err = pcall(function()
      proc.wait_file(dir .. "/ready", 10000)
      -- polling alone would ask again only after 5 s: a wake-up is what lets it in
      local lock, lerr = dlm:lock(name, { wait = 8000, retry = redlock.retry.fixed(5000, 3) })
      assert.is_truthy(lock, tostring(lerr))
      assert.is_true(dlm:stats().wakeups > 0)
      lock:unlock()
      for i = 1, 3 do
        local owner = rcluster.owner(cs[i], name)
        for j = 1, 3 do
          local pub = rcluster.calls(cs[i], j, "publish") - before[i][j][1]
          local spub = rcluster.calls(cs[i], j, "spublish") - before[i][j][2]
          assert.are.equal(0, pub, ("cluster %d master %d published"):format(i, j))
          if j == owner then assert.is_true(spub > 0, ("cluster %d: no SPUBLISH on its owner"):format(i))
          else assert.are.equal(0, spub, ("cluster %d master %d (not the owner) SPUBLISHed"):format(i, j)) end
          -- nobody listens any more: the waiter's SSUBSCRIBE was undone
          local subs = rcluster.cli(cs[i], j, "PUBSUB", "SHARDNUMSUB", "redlock:released:{" .. name .. "}")
          assert.matches("\n0$", subs)
        end
      end
    end)
    proc.wait_gone(pid, 5000)
    proc.stop(pid)
    proc.rmdir(dir)
    dlm:close()
    assert(ok, err)
  end)

  it("reads the map from the next seed when the first cannot be reached, on first use", function()
    local dead = require("redlock.devcluster.sys").free_ports(3) -- nothing listens there
    local servers = {}
    for i = 1, 3 do servers[i] = { cluster = { "redis://127.0.0.1:" .. dead[i], cs[i].seeds[2] } } end
    local dlm = client({ servers = servers })
    local lock, err, detail = dlm:try_lock(res("seed"))
    assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
    lock:unlock()
    dlm:close()
  end)

  it("a mixed list: 2 plain nodes and 1 cluster node vote together", function()
    plain = plain or cluster.start(2)
    local dlm = client({ servers = { plain.urls[1], { cluster = cs[3].seeds }, plain.urls[2] } })
    local name = res("mixed")
    local function errors(i) -- ERR replies a plain node sent: our scripts' cluster test must cost none
      return tonumber(plain:cli(i, "INFO", "errorstats"):match("errorstat_ERR:count=(%d+)")) or 0
    end
    local errors_before = { errors(1), errors(2) }
    local lock, err, detail = dlm:lock(name, { fence = true })
    assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
    assert.are.equal(lock.value, cluster.get(plain, 1, name))
    assert.are.equal(lock.value, cluster.get(plain, 2, name))
    assert.are.equal("1", cluster.get(plain, 1, name .. ":fence")) -- plain nodes keep today's names
    -- the lock returns at a quorum of 2: the cluster node's write may still
    -- be in its tail (its first use reads the map first)
    local function on_cluster(key) return (rcluster.cli(cs[3], rcluster.owner(cs[3], name), "GET", key)) end
    local by = proc.now_ms() + 5000
    while on_cluster("{" .. name .. "}:fence") ~= "1" and proc.now_ms() < by do dlm.client:sleep(10) end
    assert.are.equal(lock.value, on_cluster(name))
    assert.are.equal("1", on_cluster("{" .. name .. "}:fence"))
    assert.is_true(lock:unlock())
    local sem = assert(dlm:try_lock(name .. ":s", { limit = 2 }))
    assert.is_true(sem:unlock())
    assert.is_true(cluster.await_value(plain, name, nil, 2000))
    assert.are.same(errors_before, { errors(1), errors(2) })
    dlm:close()
  end)

  -- Before: only a refused connection named the master; a stopped one's
  -- vote said "no reply within 100 ms", then "not answering for N ms", of
  -- a node whose URL lists every seed.
  it("names the master in the text of a vote that timed out, also while it is suspect", function()
    local c = rcluster.start(3)
    local dlm = client({ servers = { { cluster = c.seeds } }, node_timeout = 100 })
    local name = names_on_every_master(c, "named")[1]
    assert(dlm:lock(name)):unlock() -- the map is known
    local j = rcluster.owner(c, name)
    local master = "(master 127.0.0.1:" .. c.ports[j] .. ")"
    proc.kill(c.pids[j], "STOP")
    local texts = {}
    for _ = 1, 3 do -- timed out, then suspect
      local lock, err, detail = dlm:try_lock(name)
      assert.is_nil(lock)
      assert.equals("unavailable", err)
      texts[#texts + 1] = detail[1].error
      dlm.client:sleep(150)
    end
    proc.kill(c.pids[j], "CONT")
    dlm:close()
    rcluster.stop(c)
    assert.matches("no reply within 100 ms", texts[1], 1, true)
    assert.matches("suspect", texts[3], 1, true)
    for i, text in ipairs(texts) do
      assert.matches(master, text, 1, true)
      assert.is_nil(text:find("(master", text:find("(master", 1, true) + 1, true), i .. ": " .. text)
    end
  end)

  it("a master that cannot be reached is one failed vote: the others decide, within the node timeout", function()
    local c = rcluster.start(3)
    local servers = { { cluster = cs[1].seeds }, { cluster = cs[2].seeds }, { cluster = c.seeds } }
    local dlm = client({ servers = servers, node_timeout = 100 })
    local name = names_on_every_master(c, "down")[1]
    assert(dlm:lock(name)):unlock() -- the map is known
    local j = rcluster.owner(c, name)
    proc.kill(c.pids[j], "STOP")
    local before = dlm:stats().nodes[3]
    local t0 = proc.now_ms()
    local lock, err, detail = dlm:lock(name)
    local took = proc.now_ms() - t0
    proc.kill(c.pids[j], "CONT")
    assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
    assert.is_true(took < 2000, took)
    local after = dlm:stats().nodes[3]
    assert.are.equal(before.votes.ok, after.votes.ok)  -- the stopped master gave no vote
    lock:unlock()
    -- killed outright: a failed vote, the lock still granted by the other two
    proc.kill(c.pids[j], "KILL")
    before = dlm:stats().nodes[3]
    local l2, err2, d2 = dlm:lock(name)
    assert.is_truthy(l2, tostring(err2) .. " " .. cluster.show(d2))
    after = dlm:stats().nodes[3]
    assert.are.equal(before.votes.ok, after.votes.ok)
    assert.is_true(after.votes.error + after.votes.timeout + after.votes.pending
      > before.votes.error + before.votes.timeout + before.votes.pending)
    l2:unlock()
    dlm:close()
    rcluster.stop(c)
  end)

  it("semaphores: at most limit holders, every slot key in the resource's slot", function()
    local dlm, other = client(), client()
    local name = res("sem")
    local a = assert(dlm:try_lock(name, { limit = 2 }))
    local b = assert(other:try_lock(name, { limit = 2 }))
    assert.are_not.equal(a.slot, b.slot)
    local c, err = dlm:try_lock(name, { limit = 2 })
    assert.is_nil(c)
    assert.are.equal("busy", err)
    for i = 1, 3 do
      local owner = rcluster.owner(cs[i], name)
      local v = rcluster.cli(cs[i], owner, "GET", ("redlock:slot:%d:{%s}"):format(a.slot, name))
      assert.are.equal(a.value, v)
      assert.are.equal(rcluster.slot(cs[i], name), rcluster.slot(cs[i], ("redlock:slot:%d:{%s}"):format(a.slot, name)))
    end
    assert.is_true(a:unlock())
    local d = assert(dlm:lock(name, { limit = 2, wait = 3000 })) -- the freed slot
    assert.are.equal(a.slot, d.slot)
    d:unlock()
    b:unlock()
    -- "{name}" is a resource of its own, not another name for this one: its
    -- slots, queue and counter are its own (its base is not name's)
    local full = assert(dlm:try_lock(name, { limit = 1 }))
    local braced = assert(other:try_lock("{" .. name .. "}", { limit = 1 }))
    full:unlock()
    braced:unlock()
    dlm:close()
    other:close()
  end)

  it("a semaphore's waiter is woken through sharded pub/sub when a slot is freed", function()
    local name = res("semwake")
    local dir = proc.tmpdir()
    local holder = client()
    local held = assert(holder:try_lock(name, { limit = 1 }))
    local code = ([[
      local redlock = require "redlock"
      local proc = require "helpers.proc"
      local dlm = redlock.new { servers = { %q, %q, %q }, ttl = 5000 }
      proc.write_file(%q, "1")
      local l, err = dlm:lock(%q, { limit = 1, wait = 8000, retry = redlock.retry.fixed(5000, 3) })
      io.write(l and "got" or ("fail " .. tostring(err)), " wakeups=", dlm:stats().wakeups, "\n")
      if l then l:unlock() end
    ]]):format(cs[1].url, cs[2].url, cs[3].url, dir .. "/ready", name)
    local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
    local ok, err = pcall(function()
      proc.wait_file(dir .. "/ready", 10000)
      proc.sleep_ms(500) -- it asks, is refused and waits (polling again only after 5 s)
      assert.is_true(held:unlock())
      assert.is_true(proc.wait_gone(pid, 10000))
      local out = proc.read_file(dir .. "/out") or ""
      local wakeups = tonumber(out:match("^got wakeups=(%d+)"))
      assert.is_truthy(wakeups, out)
      assert.is_true(wakeups > 0, out)
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    holder:close()
    assert(ok, err)
  end)

  it("shared locks: readers together, a writer kept out, the readers' set in the resource's slot", function()
    local dlm, other = client(), client()
    local name = res("shared")
    local r1 = assert(dlm:try_lock(name, { shared = true }))
    local r2 = assert(other:try_lock(name, { shared = true }))
    local w, err = other:try_lock(name)
    assert.is_nil(w)
    assert.are.equal("busy", err)
    local function readers()
      local n = {}
      for i = 1, 3 do n[i] = rcluster.cli(cs[i], rcluster.owner(cs[i], name), "ZCARD", "redlock:readers:{" .. name .. "}") end
      return table.concat(n, " ")
    end
    local deadline = proc.now_ms() + 5000 -- each client's tail is served by its next call
    while readers() ~= "2 2 2" and proc.now_ms() < deadline do cluster.drive(dlm); cluster.drive(other); proc.sleep_ms(10) end
    assert.are.equal("2 2 2", readers())
    assert.is_true(r1:unlock())
    assert.is_true(r2:unlock())
    local w2 = assert(other:try_lock(name))
    w2:unlock()
    dlm:close()
    other:close()
  end)

  it("the host takes cluster nodes as redis-cluster:// URLs, in --servers and REDLOCK_SERVERS", function()
    local bin = proc.root .. "/build/redlock"
    local name = res("host")
    local list = table.concat({ cs[1].url, cs[2].url, cs[3].url }, ",")
    local out, rc = proc.sh(("%s exec --fence --servers %s %s -- sh -c %s"):format(proc.quote(bin), proc.quote(list),
      proc.quote(name), proc.quote("echo token=$REDLOCK_TOKEN; redis-cli -p " .. rcluster.owner_port(cs[1], name)
        .. " GET " .. name)))
    assert.are.equal(0, rc, out)
    local token, value = out:match("token=(%d+)\n(%S+)")
    assert.are.equal("1", token, out)
    assert.is_truthy(value, out)
    out, rc = proc.sh(("REDLOCK_SERVERS=%s %s exec %s -- true"):format(proc.quote(list), proc.quote(bin), proc.quote(name)))
    assert.are.equal(0, rc, out)
  end)

  it("TLS: rediss:// seeds, every shard spoken to over TLS", function()
    local tls = require "helpers.tls"
    local pki = tls.make()
    local c = rcluster.start(3, { tls = pki })
    local servers = { { cluster = c.seeds }, { cluster = cs[2].seeds }, { cluster = cs[3].seeds } }
    -- quorum 3: no lock without the TLS cluster's vote
    local dlm = client({ servers = servers, tls = { cafile = pki.ca }, quorum = 3 })
    local ok, err = pcall(function()
      for _, name in ipairs(names_on_every_master(c, "tls")) do
        local lock, lerr, detail = dlm:lock(name, { fence = true })
        assert.is_truthy(lock, tostring(lerr) .. " " .. cluster.show(detail))
        assert.are.equal(lock.value, (rcluster.cli(c, rcluster.owner(c, name), "GET", name)))
        assert.is_true(lock:unlock())
      end
    end)
    dlm:close()
    rcluster.stop(c)
    assert(ok, err)
  end)

  it("TLS: masters that announce a hostname are checked against it, with a certificate for that name only", function()
    local tls = require "helpers.tls"
    local pki = tls.make()
    local certs = setmetatable({ server_cert = pki.localhost_cert, server_key = pki.localhost_key }, { __index = pki })
    local c = rcluster.start(3, { tls = certs, config = { "--cluster-announce-hostname", "localhost",
      "--cluster-preferred-endpoint-type", "hostname" } })
    local function servers()
      return { { cluster = { "rediss://localhost:" .. c.ports[1] } }, { cluster = cs[2].seeds }, { cluster = cs[3].seeds } }
    end
    local ok, err = pcall(function()
      -- quorum 3: no lock without the TLS cluster's vote, on each of its masters (at 127.0.0.1)
      local dlm = client({ servers = servers(), tls = { cafile = pki.ca }, quorum = 3 })
      for _, name in ipairs(names_on_every_master(c, "tlsname")) do
        local lock, lerr, detail = dlm:lock(name)
        assert.is_truthy(lock, tostring(lerr) .. " " .. cluster.show(detail))
        assert.are.equal(lock.value, (rcluster.cli(c, rcluster.owner(c, name), "GET", name)))
        assert.is_true(lock:unlock())
      end
      dlm:close()
      -- a hostname the certificate is not for: each master's vote fails, saying which master
      for j = 1, c.n do rcluster.cli(c, j, "CONFIG", "SET", "cluster-announce-hostname", "other.example") end
      local deadline = proc.now_ms() + 10000
      while select(2, (rcluster.cli(c, 1, "CLUSTER", "NODES")):gsub(",other%.example", "")) < c.n do
        assert(proc.now_ms() < deadline, "the masters' new hostname did not spread")
        proc.sleep_ms(50)
      end
      dlm = client({ servers = servers(), tls = { cafile = pki.ca }, quorum = 3 })
      for _, name in ipairs(names_on_every_master(c, "tlsother")) do
        local lock, _, detail = dlm:lock(name)
        assert.is_nil(lock)
        assert.are.equal(("hostname mismatch: the server's certificate is not for other.example (master 127.0.0.1:%d)")
          :format(c.ports[rcluster.owner(c, name)]), detail[1].error)
      end
      dlm:close()
    end)
    rcluster.stop(c)
    assert(ok, err)
  end)

  it("refuses misconfigured cluster entries, naming the argument", function()
    assert.has_error(function() redlock.new({ servers = { { cluster = {} } } }) end,
      "bad argument #1 to 'new' (servers[1].cluster must be a non-empty list of seed URLs, got table)")
    assert.has_error(function()
      redlock.new({ servers = { { cluster = { "redis://a:1@127.0.0.1:1", "redis://127.0.0.1:2" } } } })
    end, "bad argument #1 to 'new' (servers[1].cluster[2]: every seed of a cluster must share its scheme and password)")
    assert.has_error(function() redlock.new({ servers = { { cluster = { "redis://127.0.0.1:1/2" } } } }) end,
      "bad argument #1 to 'new' (servers[1].cluster[1]: a cluster has only database 0: no /db)")
    -- before: the seed's URL was cut to 600 bytes, and a cut port connected elsewhere
    local pw = ("%41"):rep(191) .. "ab"
    assert.has_error(function() redlock.new({ servers = { "redis-cluster://:" .. pw .. "@127.0.0.1:260019" } }) end,
      "bad argument #1 to 'new' (server 1: 'redis-cluster://127.0.0.1:260019': a seed URL is too long)")
  end)
end)
