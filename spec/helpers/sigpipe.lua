-- Spec helper script for spec/signals_spec.lua (run as its own OS process,
-- under plain luajit or `redlock run`; not required):
--
--   sigpipe.lua dispositions RESOURCE URL...
--     Lock and unlock RESOURCE with a client, keep the client open, and print
--     how SIGPIPE is set up in this process and in children it starts:
--       start=B    ignored (1) or not (0) before redlock was loaded
--       self=B     ignored in this process after the lock and unlock
--       popen=B    ignored in a child started by io.popen
--       execute=B  ignored in a child started by os.execute
--       yes=N      exit status of `yes` writing into `head -1` (141: SIGPIPE)
--
--   sigpipe.lua survive WHEN NODE_PID RESOURCE URL...
--     After a lock and unlock that every node has answered, begin a batch of
--     acquires, SIGKILL node 1 (whose pid is NODE_PID) and wait until it is
--     gone, then begin a second batch and wait for both. WHEN says where the
--     first batch is at the kill: "written" (sent, replies on their way) or
--     "queued" (not sent yet: node 1 had read every byte sent to it, so the
--     first thing the client does next is write to a socket whose peer has
--     closed). Once every operation has finished, print done=N (operations
--     finished), and for the second batch ok=N (granted) and node1_ok=N
--     (node 1 voted for). A SIGPIPE would end the process (status 141).
--
-- Under plain luajit SIGPIPE is first set to SIG_DFL, whatever the parent
-- left, so that what the spec sees is what redlock did.
local ffi = require "ffi"
local bit = require "bit"

ffi.cdef [[
  void *rl_sigpipe_signal(int sig, void *handler) asm("signal");
  int rl_sigpipe_kill(int pid, int sig) asm("kill");
  int rl_sigpipe_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
]]
local SIGKILL, SIGPIPE = 9, 13

local in_host = package.loaded["redlock.host"] ~= nil
if not in_host then ffi.C.rl_sigpipe_signal(SIGPIPE, nil) end -- SIG_DFL

-- 1 if the SigIgn mask in a /proc/PID/status text has SIGPIPE (bit 12), else 0.
local function ignored(status)
  local mask = assert(status:match("SigIgn:%s*(%x+)"), "no SigIgn line in:\n" .. status)
  return bit.band(tonumber(mask:sub(-4), 16), bit.lshift(1, SIGPIPE - 1)) ~= 0 and 1 or 0
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function out(k, v)
  io.write(k, "=", tostring(v), "\n")
  io.flush()
end

local mode, urls = arg[1], {}

if mode == "dispositions" then
  out("start", ignored(read("/proc/self/status")))
  local redlock = require "redlock"
  local resource = arg[2]
  for i = 3, #arg do urls[#urls + 1] = arg[i] end
  local dlm = redlock.new { servers = urls, node_timeout = 2000 }
  local lock, err = dlm:lock(resource, { ttl = 10000, wait = 5000 })
  assert(lock, "lock failed: " .. tostring(err))
  assert(lock:unlock())
  out("self", ignored(read("/proc/self/status")))
  local p = assert(io.popen("cat /proc/self/status"))
  out("popen", ignored(p:read("*a")))
  p:close()
  local tmp = os.tmpname()
  os.execute("cat /proc/self/status > " .. tmp)
  out("execute", ignored(read(tmp)))
  os.remove(tmp)
  p = assert(io.popen([[{ (yes; echo "yes=$?" >&2) | head -1 >/dev/null; } 2>&1]]))
  out("yes", p:read("*a"):match("yes=(%d+)"))
  p:close()
  dlm:close()
  os.exit(0)
elseif mode == "survive" then
  local cdefs = require "redlock.cdefs"
  local C = cdefs.lib
  local when, node_pid, resource = arg[2], tonumber(arg[3]), arg[4]
  assert(when == "written" or when == "queued", "survive: WHEN is written or queued")
  for i = 5, #arg do urls[#urls + 1] = arg[i] end
  local curls = ffi.new("const char *[?]", #urls, urls)
  local opts = ffi.new("rl_options")
  C.rl_options_init(opts)
  opts.node_timeout_ms = 5000 -- the live nodes always answer in time, however busy the machine
  local err = ffi.new("char[?]", C.RL_ERR_LEN)
  local c = C.rl_client_new(curls, #urls, opts, err, ffi.sizeof(err))
  assert(c ~= nil, ffi.string(err))
  local r = ffi.new("rl_result")

  -- Every node connected: no node fails a vote, and the nodes slower than
  -- the quorum finish the round's tail while the client sleeps.
  local warm = resource .. ":warm"
  assert(C.rl_acquire(c, warm, #warm, 10000, r) == C.RL_OK and r.status == C.RL_STATUS_OK, "warm-up acquire failed")
  assert(r.failed == 0, "warm-up acquire: a node failed its vote")
  C.rl_release(c, warm, #warm, ffi.string(r.value), r)
  assert(r.status == C.RL_STATUS_OK and r.failed == 0, "warm-up release: a node failed its vote")
  C.rl_sleep(c, 100)

  local BATCH = 200
  local ids = {}
  local function begin_batch(tag)
    for i = 1, BATCH do
      local name = ("%s:%s:%d"):format(resource, tag, i)
      local id = C.rl_begin_acquire(c, name, #name, 10000)
      assert(id >= 0, ffi.string(C.rl_client_errstr(c)))
      ids[#ids + 1] = id
    end
  end

  begin_batch("a")
  if when == "written" then C.rl_run(c, 0) end
  assert(C.rl_sigpipe_kill(node_pid, SIGKILL) == 0, "cannot kill node 1")
  -- Its sockets are closed once every thread of it has exited: a zombie
  -- leader alone is not enough (the other threads may still hold the files).
  local function threads_left()
    local p = io.popen("cat /proc/" .. node_pid .. "/task/*/stat 2>/dev/null")
    local stat = p:read("*a")
    p:close()
    local n = 0
    for state in stat:gmatch("%d+ %b() (%a)") do
      if state ~= "Z" and state ~= "X" then n = n + 1 end
    end
    return n
  end
  for _ = 1, 1000 do
    if threads_left() == 0 then break end
    C.rl_sigpipe_poll(nil, 0, 10)
  end
  assert(threads_left() == 0, "node 1 did not exit")
  begin_batch("b")

  local done, ok, node1_ok = 0, 0, 0
  for k, id in ipairs(ids) do
    assert(C.rl_wait(c, id, r) == C.RL_OK, "rl_wait refused id " .. id)
    done = done + 1
    if k > BATCH then -- the batch queued after the kill
      if r.status == C.RL_STATUS_OK then ok = ok + 1 end
      if r.node[0].state == C.RL_NODE_OK then node1_ok = node1_ok + 1 end
    end
  end
  C.rl_client_free(c)
  io.write(("done=%d ok=%d node1_ok=%d\n"):format(done, ok, node1_ok))
  os.exit(0)
else
  io.stderr:write("sigpipe.lua: unknown mode ", tostring(mode), "\n")
  os.exit(2)
end
