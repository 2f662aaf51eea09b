-- The `redlock` host executable, through the real binary against real
-- redis-server nodes (redlock.devcluster). The binary is build/redlock, or
-- $REDLOCK_HOST.

local devcluster = require "redlock.devcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local faults = require "helpers.faults"

-- Wall clock in ms: the children below log with `date +%s%3N`.
local wall_ms, sleep_ms, q = proc.wall_ms, proc.sleep_ms, proc.quote
local read_file, write_file = proc.read_file, proc.write_file

local ROOT = io.popen("pwd"):read("*l")
local BIN = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end

--- Run a shell command; return its output (stderr merged), exit status and ms taken.
local function sh(cmd)
  local t0 = wall_ms()
  local out, rc = proc.sh(cmd)
  return out, rc, wall_ms() - t0
end

local TMP -- a fresh directory per run (setup)

--- `redlock ARGS` with env (a string of VAR=value words, or "") in dir TMP.
local function redlock(args, env)
  return sh(("cd %s && env %s %s %s"):format(q(TMP), env or "", q(BIN), args))
end

--- Start `redlock ARGS` in the background; return a handle with pid, and
-- :wait(ms) -> exit status, output (nil on timeout). via: words that run
-- redlock in the same process (`env --ignore-signal=CHLD`: sh, which starts
-- it, sets SIGCHLD back to its default).
local bg_count = 0
local function bg(args, env, via)
  bg_count = bg_count + 1
  local base = ("%s/bg%d"):format(TMP, bg_count)
  os.execute(("cd %s && ( env %s sh -c 'echo $$ > %s.pid; exec \"$0\" \"$@\"' %s%s %s > %s.out 2>&1;"
    .. " echo $? > %s.rc.tmp; mv %s.rc.tmp %s.rc ) < /dev/null > /dev/null 2>&1 &")
    :format(q(TMP), env or "", q(base), via and via .. " " or "", q(BIN), args, q(base), q(base), q(base), q(base)))
  local pid
  for _ = 1, 500 do
    pid = tonumber(read_file(base .. ".pid") or "")
    if pid then break end
    sleep_ms(10)
  end
  assert(pid, "background redlock did not start")
  return {
    pid = pid,
    output = function() return read_file(base .. ".out") or "" end,
    signal = function(_, sig) return proc.kill(pid, sig) end,
    wait = function(self, ms)
      local deadline = wall_ms() + (ms or 10000)
      repeat
        local rc = tonumber(read_file(base .. ".rc") or "")
        if rc then return rc, self.output() end
        sleep_ms(10)
      until wall_ms() > deadline
      return nil, self.output()
    end,
  }
end

-- `env` words that start redlock with SIGQUIT at its default: a shell starts
-- its background jobs (bg above), and may start busted itself, with it ignored,
-- and redlock leaves a signal ignored at start ignored.
local QUIT_DFL = "--default-signal=QUIT"

--- Poll until f() is true (up to ms); return whether it became true.
local function eventually(f, ms)
  local deadline = wall_ms() + (ms or 5000)
  repeat
    if f() then return true end
    sleep_ms(10)
  until wall_ms() > deadline
  return false
end

--- A shell command that waits (up to 30 s) until the file name exists in its
--- working directory: a terminal's keystroke sent after it finds the job ready.
local function until_file(name)
  return ("i=0; while [ ! -e %s ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"):format(name)
end

describe("the redlock host", function()
  local cl, SERVERS, ENV

  local function get(i, key)
    local out = cl:cli(i, "GET", key)
    return out ~= "" and out or nil
  end

  local function holders(key)
    local t = {}
    for i = 1, cl.n do t[i] = get(i, key) or false end
    return t
  end

  local function gone_everywhere(key)
    for i = 1, cl.n do
      if get(i, key) then return false end
    end
    return true
  end

  local function script(name, text)
    write_file(TMP .. "/" .. name, text)
    return name
  end

  -- A command (script `name`) that writes "start" to marks, "TERM" on each
  -- SIGTERM (which it ignores), and "end" after about steps × 10 ms.
  local function marking_script(name, marks, steps)
    return script(name, ([[
trap 'echo TERM >> %s' TERM
echo start >> %s
i=0; while [ $i -lt %d ]; do sleep 0.01; i=$((i+1)); done
echo end >> %s
]]):format(marks, marks, steps, marks))
  end

  setup(function()
    local f = io.open(BIN, "rb")
    assert(f, BIN .. " is not built (cmake -S . -B build && cmake --build build)")
    f:close()
    TMP = proc.tmpdir()
    cl = devcluster.start { n = 5 }
    SERVERS = table.concat(cl.urls, ",")
    ENV = "REDLOCK_SERVERS=" .. SERVERS
  end)

  teardown(function()
    faults.stop_all()
    if cl then cl:stop() end
    proc.rmdir(TMP)
  end)

  describe("command line", function()
    it("prints help and version and exits 0", function()
      local out, rc = redlock("--help")
      assert.are.equal(0, rc)
      assert.matches("Usage: redlock COMMAND", out, 1, true)
      for _, cmd in ipairs { "run", "exec", "status", "dev", "demo" } do
        out, rc = redlock(cmd .. " --help")
        assert.are.equal(0, rc, cmd .. ": " .. out)
        assert.matches("Usage: redlock " .. cmd, out, 1, true)
      end
      out, rc = redlock("--version")
      assert.are.equal(0, rc)
      assert.matches("^redlock %d+%.%d+%.%d+", out)
    end)

    -- Before: demo-worker's options left --help out: "unknown option --help",
    -- exit 64, with a hint to run the very same command.
    it("demo-worker --help prints its usage and exits 0", function()
      local out, rc = redlock("demo-worker --help")
      assert.are.equal(0, rc, out)
      assert.matches("usage: redlock demo-worker", out, 1, true)
    end)

    -- Before: run --help named SIGINT (130) and SIGTERM (143) only.
    it("run --help names every signal on which the host releases the script's locks", function()
      local out = redlock("run --help"):gsub("%s+", " ")
      for _, said in ipairs { "SIGINT (exit 130)", "SIGTERM (exit 143)", "SIGHUP (exit 129)", "SIGQUIT (exit 131)",
                              "SIGPIPE when the script prints to a pipe whose reader is gone (exit 141)" } do
        assert.matches(said, out, 1, true)
      end
    end)

    it("rejects an unknown command or option with status 64", function()
      local out, rc = redlock("frobnicate")
      assert.are.equal(64, rc)
      assert.matches("redlock: unknown command 'frobnicate'", out, 1, true)
      out, rc = redlock("exec --bogus r -- true", ENV)
      assert.are.equal(64, rc)
      assert.matches("unknown option --bogus", out, 1, true)
      out, rc = redlock("exec --ttl abc r -- true", ENV)
      assert.are.equal(64, rc)
      assert.matches("--ttl expects a time from 1 ms to 2147483647 ms (500ms, 10s, 1.5s, 2m, 1h; a bare number is ms),"
        .. " got 'abc'", out, 1, true)
    end)

    it("a number out of range is a usage error (64) naming the flag, never a traceback", function()
      for _, case in ipairs {
        { "exec --ttl 99999999999 r -- true", "--ttl expects a time from 1 ms to 2147483647 ms" },
        { "exec --ttl 99999999999 r -- true", "got '99999999999'" },
        { "exec --grace 99999999999999999999 r -- true",
          "--grace expects a time from 0 ms to 2147483647 ms (500ms, 10s, 1.5s, 2m, 1h; a bare number is ms),"
            .. " got '99999999999999999999'" },
        { "exec -w 2147483648 r -- true", "-w expects a time from 0 ms to 2147483647 ms" },
        { "exec -w 2147484s r -- true", "-w expects a time from 0 ms to 2147483647 ms" },
        { "exec --ttl 596524h r -- true", "--ttl expects a time from 1 ms to 2147483647 ms" },
        { "status --servers redis://127.0.0.1:99999 r", "port must be a number from 1 to 65535" },
      } do
        local out, rc = redlock(case[1], ENV)
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        assert.matches(case[2], out, 1, true)
        assert.is_nil(out:find("traceback", 1, true), out)
        assert.is_nil(out:find("-9223372036854775808", 1, true), out)
      end
    end)

    -- Before: a time was a bare number of ms only; `-w 10s` was a usage error.
    it("takes times with a unit (500ms, 10s, 1.5s, 2m, 1h); a bare number is ms", function()
      local function validity(args)
        local out, rc = redlock("exec " .. args .. " units:r -- sh -c 'echo valid=$REDLOCK_VALIDITY_MS'", ENV)
        assert.are.equal(0, rc, args .. ": " .. out)
        assert.is_nil(out:find("warning", 1, true), args .. ": " .. out)
        return tonumber(out:match("valid=(%d+)")), out
      end
      for _, case in ipairs {
        { "--ttl 1.5s", 1500 }, { "--ttl 1500ms", 1500 }, { "--ttl 1500", 1500 }, { "--ttl=3s", 3000 },
        { "--ttl 2m", 120000 }, { "--ttl 0.1h", 360000 }, { "--ttl 2.25s", 2250 },
      } do
        local v, out = validity(case[1])
        -- validity: the ttl less the round and the drift (ttl/100 + 2 ms)
        assert.is_true(v and v <= case[2] and v > case[2] * 0.98 - 200, case[1] .. ": " .. out)
      end
      -- -w with a unit: gives up after that long, not before
      local holder = bg("exec units:held -- sleep 4", ENV)
      assert.is_true(eventually(function() return get(1, "units:held") ~= nil end))
      local out, rc, took = redlock("exec -w 1.2s units:held -- echo ran", ENV)
      assert.are.equal(1, rc, out)
      assert.is_true(took >= 1200, "took " .. took .. " ms")
      assert.is_nil(out:find("ran", 1, true), out)
      assert.are.equal(0, (holder:wait(10000)))
    end)

    it("rejects a time that is not one with a usage error (64) naming the flag and the units", function()
      for _, case in ipairs {
        { "--ttl 10x", "--ttl", "10x" }, { "--ttl 1.5", "--ttl", "1.5" }, { "--ttl s", "--ttl", "s" },
        { "--ttl 1.0005s", "--ttl", "1.0005s" }, { "--ttl 0.5ms", "--ttl", "0.5ms" }, { "--ttl 10.s", "--ttl", "10.s" },
        { "--ttl 10S", "--ttl", "10S" }, { "--ttl ' 10s'", "--ttl", " 10s" }, { "--ttl 0s", "--ttl", "0s" },
        { "-w -1s", "-w", "-1s" }, { "--wait 1e3", "--wait", "1e3" },
        { "--timeout 5sec", "--timeout", "5sec" },
      } do
        local out, rc = redlock("exec " .. case[1] .. " units:bad -- echo ran", ENV)
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        assert.matches(("redlock: %s expects a time from "):format(case[2]), out, 1, true)
        assert.matches("(500ms, 10s, 1.5s, 2m, 1h; a bare number is ms), got '" .. case[3] .. "'", out, 1, true)
        assert.is_nil(out:find("ran", 1, true), out)
      end
    end)

    -- Before: `--ttl 60` ran with 60 ms and `-w 10` gave up after 10 ms, silently.
    it("warns on stderr when a bare --ttl, -w or --timeout under 1000 was likely meant in seconds", function()
      for _, case in ipairs {
        { "--ttl 600", "--ttl 600 means 600 ms; did you mean 600s? (write 600ms to keep ms)" },
        { "--ttl=999", "--ttl 999 means 999 ms; did you mean 999s?" },
        { "-w 10", "-w 10 means 10 ms; did you mean 10s?" },
        { "-w10", "-w 10 means 10 ms; did you mean 10s?" },
        { "--wait 5", "--wait 5 means 5 ms; did you mean 5s?" },
        { "--timeout 30", "--timeout 30 means 30 ms; did you mean 30s?" },
      } do
        local out, rc = redlock("exec " .. case[1] .. " units:warn -- echo ran", ENV)
        assert.are.equal(0, rc, case[1] .. ": " .. out)
        assert.matches("redlock: warning: " .. case[2], out, 1, true)
        assert.matches("ran\n", out, 1, true) -- a warning, not an error: the command ran
      end
      -- a unit says it was meant; 0 and 1000 on are plausible ms
      for _, args in ipairs { "--ttl 600ms", "--ttl 1000", "--ttl 20000", "-w 0", "-w 10ms", "-w 1000", "--timeout 0.5s",
        "--grace 5 --ttl 10s" } do
        local out, rc = redlock("exec " .. args .. " units:nowarn -- echo ran", ENV)
        assert.are.equal(0, rc, args .. ": " .. out)
        assert.are.equal("ran\n", out, args)
      end
    end)

    it("--help says, for every time flag, that a bare number is ms", function()
      local out, rc = redlock("exec --help")
      assert.are.equal(0, rc, out)
      assert.matches("^Usage: redlock exec %[OPTIONS%] RESOURCE", out)
      assert.matches("\nOptions:\n", out)
      for _, flag in ipairs { "--ttl TIME", "-w, --wait TIME", "--timeout TIME", "--grace TIME" } do
        local line = out:match("\n%s*" .. flag:gsub("%p", "%%%0") .. "[^\n]*")
        assert.is_truthy(line, flag .. " is missing: " .. out)
        assert.matches("bare number: ms", line, 1, true)
      end
      assert.matches("TIME is a number with a unit: 500ms, 10s, 1.5s, 2m, 1h. A bare number is\nmilliseconds", out, 1, true)
      out = redlock("--help")
      assert.matches("a bare number is milliseconds", out, 1, true)
    end)

    -- Before: `redlock exec R -c CMD` ran "-c": "redlock: -c: command not found" (127).
    it("answers flock's -c with the command to write instead (64)", function()
      local out, rc = redlock("exec units:c -c 'echo ran; echo it' ", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("exec takes the command itself, not -c: write `redlock exec units:c -- sh -c 'echo ran; echo it'`",
        out, 1, true)
      out, rc = redlock("exec units:c --command date", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("write `redlock exec units:c -- sh -c date`", out, 1, true)
      out, rc = redlock("exec -c 'echo ran' units:c", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("unknown option -c; exec takes the command itself, not -c: write `redlock exec RESOURCE -- sh -c 'CMD'`",
        out, 1, true)
      out, rc = redlock("exec units:c -c", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("sh -c 'CMD'", out, 1, true)
      assert.is_nil(out:find("command not found", 1, true), out)
      assert.is_true(gone_everywhere("units:c"))
    end)

    -- Before: a node that had not answered when the round was decided was
    -- shown as a bare "pending" next to the others' reasons.
    it("says what pending means in an unavailable message", function()
      local silent = faults.fakeserver("silent")
      finally(function() silent:stop() end)
      local servers = "redis://127.0.0.1:1,redis://127.0.0.1:2," .. silent.url
      local out, rc = redlock("exec -n --servers " .. servers .. " units:pending -- echo ran", "")
      assert.are.equal(69, rc, out)
      assert.matches("cannot lock 'units:pending': unavailable", out, 1, true)
      assert.matches("node 1 redis://127.0.0.1:1: error (connect failed", out, 1, true)
      assert.matches("node 3 " .. silent.url .. ": pending (no reply yet when the round was decided)\n", out, 1, true)
    end)

    -- before: the policy's string reached rl_sleep; a traceback and exit 1
    it("a --policy that returns what is not a delay is a usage error (64), never a traceback", function()
      local policy = script("strpolicy.lua", [[return function() return "soon" end]])
      for i = 1, 3 do cl:cli(i, "SET", "policy:r", "someone", "PX", "10000") end
      local out, rc = redlock("exec --policy " .. policy .. " policy:r -- true", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("--policy " .. policy .. ": bad retry policy: after attempt 1 it returned string \"soon\"", out, 1, true)
      assert.is_nil(out:find("traceback", 1, true), out)
      for i = 1, 3 do cl:cli(i, "DEL", "policy:r") end
    end)

    it("a --policy that raises is a usage error (64) naming the file, never a traceback", function()
      for i = 1, 3 do cl:cli(i, "SET", "policy:raises", "someone", "PX", "30000") end
      finally(function() for i = 1, 3 do cl:cli(i, "DEL", "policy:raises") end end)
      for _, case in ipairs {
        { "return function() error('policy exploded') end", "policy exploded" },
        { "return function() error({}) end", "(error object is a table value)" },
        { "return function() error(setmetatable({}, { __tostring = function() return 'told' end })) end", "told" },
        -- before: a __tostring that raises escaped as a traceback, exit 1
        { "return function() error(setmetatable({}, { __tostring = function() error('x') end })) end",
          "(error object is a table value)" },
      } do
        local policy = script("raising.lua", case[1])
        local out, rc = redlock("exec --policy " .. policy .. " policy:raises -- echo ran", ENV)
        assert.are.equal(64, rc, out)
        assert.matches("^redlock: %-%-policy raising.lua: ", out)
        assert.matches(case[2], out, 1, true)
        assert.is_nil(out:find("traceback", 1, true), out)
        assert.is_nil(out:find("ran", 1, true), out)
      end
    end)

    -- Before: --timeout was read only when -w was not given, in any order.
    it("takes the last of -w and --timeout given, as a repeated -w", function()
      for i = 1, 3 do cl:cli(i, "SET", "wait:last", "someone", "PX", "60000") end
      finally(function() for i = 1, 3 do cl:cli(i, "DEL", "wait:last") end end)
      for _, flags in ipairs { "-w 60s --timeout 300ms", "--timeout 60s -w 300ms", "-w 60s -w 300ms" } do
        local out, rc = redlock("exec " .. flags .. " wait:last -- echo ran", ENV)
        assert.are.equal(1, rc, flags .. ": " .. out)
        assert.matches("'wait:last' is held elsewhere (gave up waiting)", out, 1, true)
        assert.is_nil(out:find("ran", 1, true), out)
      end
    end)

    it("never shows a password from --servers in a message", function()
      for _, args in ipairs {
        "exec --servers redis://:s3cret@127.0.0.1:99999 r -- true",
        "exec --servers redis://me:s3cret@127.0.0.1:99999,redis://:s3cret@127.0.0.1:1 r -- true",
        "exec --servers redis://me:s3cret@127.0.0.1:1,redis://me:s3cret@127.0.0.1:1 r -- true",
        "exec --servers redis://:s3cret@127.0.0.1:bad --ttl 0 r -- true",
        "status --servers redis://:s3cret@127.0.0.1:99999 r",
        "status --servers redis-cluster://:s3cret@ r",
        "exec --servers redis-cluster://me:s3cret@ r -- true",
      } do
        local out, rc = redlock(args, "-u REDLOCK_SERVERS")
        assert.are.equal(64, rc, args .. ": " .. out)
        assert.is_nil(out:find("s3cret", 1, true), args .. ": " .. out)
      end
      -- the usage text in the message is no URL to mask (before:
      -- "(redis-cluster://host:***")
      local usage = redlock("status --servers redis-cluster://:s3cret@ r", "-u REDLOCK_SERVERS")
      assert.matches("(redis-cluster://host:port+host:port)", usage, 1, true)
      local out = redlock("exec --servers redis://:s3cret@127.0.0.1:99999 r -- true", "")
      assert.matches("redis://:***@127.0.0.1:99999", out, 1, true)
    end)

    it("never shows a part of a password cut by the split at commas, blanks or # comments", function()
      write_file(TMP .. "/blank.servers", "redis://:hunTer2 topSecret@127.0.0.1:1\n")
      write_file(TMP .. "/hash.servers", "redis://:abcHash#defHash@127.0.0.1:1\n")
      write_file(TMP .. "/colon.servers", "redis://me:paSS:woRD,xyz@127.0.0.1:bad\n")
      -- before: the '#' started a comment, and the rest was a valid URL of host "ssw"
      write_file(TMP .. "/at.servers", "redis://:Pa@ssw#rd@127.0.0.1:1\n")
      for _, case in ipairs {
        { "exec -n --servers 'redis://:paSS,woRD@127.0.0.1:1' r -- true", "paSS", "woRD" },
        { "status --servers 'redis://:paSS,woRD@127.0.0.1:1' r", "paSS", "woRD" },
        { "exec -n --servers-file blank.servers r -- true", "hunTer2", "topSecret" },
        { "status --servers-file blank.servers r", "hunTer2", "topSecret" },
        { "exec -n --servers-file hash.servers r -- true", "abcHash", "defHash" },
        { "exec -n --servers-file colon.servers r -- true", "paSS", "woRD" },
        { "exec -n --servers-file at.servers r -- true", "ssw", "rd@" },
        { "status --servers-file at.servers r", "ssw", "rd@" },
      } do
        local out, rc = redlock(case[1], "-u REDLOCK_SERVERS")
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        for i = 2, #case do assert.is_nil(out:find(case[i], 1, true), case[1] .. ": " .. out) end
        assert.matches("redis://", out, 1, true)
      end
      -- a host and port are no password
      local out = redlock("exec -n --servers redis://127.0.0.1:1,redis://127.0.0.1:1/0 r -- true", "")
      assert.matches("(redis://127.0.0.1:1)", out, 1, true)
      -- nor is a list split at the wrong character: the message shows the mistake
      out = redlock("exec -n r -- true", "REDLOCK_SERVERS='redis://127.0.0.1:1;redis://127.0.0.1:2'")
      assert.matches("redis://127.0.0.1:1;redis://127.0.0.1:2", out, 1, true)
      out = redlock("status --servers redis://127.0.0.1:1,redis://127.0.0.1:2/1 r", "")
      assert.matches("redis://127.0.0.1:1  ", out, 1, true)
      assert.matches("redis://127.0.0.1:2/1  ", out, 1, true)
    end)

    it("a --servers-file that is a directory is a usage error (64) naming it", function()
      os.execute("mkdir -p " .. q(TMP .. "/servers.d"))
      for _, args in ipairs { "exec -n --servers-file servers.d r -- true", "status --servers-file servers.d r" } do
        local out, rc = redlock(args, "-u REDLOCK_SERVERS")
        assert.are.equal(64, rc, args .. ": " .. out)
        assert.matches("^redlock: %-%-servers%-file: cannot read servers.d: Is a directory\n$", out)
      end
    end)

    it("without servers names --servers, REDLOCK_SERVERS and redlock dev", function()
      local out, rc = redlock("exec r -- true", "-u REDLOCK_SERVERS")
      assert.are.equal(64, rc)
      assert.matches("--servers", out, 1, true)
      assert.matches("REDLOCK_SERVERS", out, 1, true)
      assert.matches("redlock dev", out, 1, true)
      out, rc = redlock("status r", "-u REDLOCK_SERVERS")
      assert.are.equal(64, rc)
      assert.matches("redlock dev", out, 1, true)
    end)

    it("takes the servers from --servers too", function()
      local out, rc = redlock("exec --servers " .. SERVERS .. " cli-servers -- true", "-u REDLOCK_SERVERS")
      assert.are.equal(0, rc, out)
    end)
  end)

  describe("run", function()
    it("runs a script with arg set the standard way and exits with its number", function()
      local name = script("args.lua", [[
        local redlock = require "redlock"
        local dlm = redlock.default()
        local lock = assert(dlm:lock("run:args", { ttl = 2000 }))
        print("arg", arg[0], arg[1], arg[2], arg[-1], select("#", ...), ...)
        assert(lock:unlock())
        return 7
      ]])
      local out, rc = redlock("run " .. name .. " a 'b c'", ENV)
      assert.are.equal(7, rc, out)
      assert.matches("arg\targs.lua\ta\tb c\trun\t2\ta\tb c", out, 1, true)
    end)

    -- Before: arg[-2] was nil, and with options before the script the
    -- executable was missing from the negative indices altogether.
    it("gives the script the whole command line before it in arg's negative indices", function()
      local name = script("argneg.lua", [[
        local t = {}
        for i = -6, 0 do t[#t + 1] = tostring(arg[i]) end
        print("neg " .. table.concat(t, " "))
      ]])
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(0, rc, out)
      assert.matches("neg nil nil nil nil " .. BIN .. " run argneg.lua\n", out, 1, true)
      out, rc = redlock("run --prefix p: " .. name, ENV)
      assert.are.equal(0, rc, out)
      assert.matches("neg nil nil " .. BIN .. " run --prefix p: argneg.lua\n", out, 1, true)
    end)

    -- Before: in the host, a release heard during a policy delay cost the
    -- policy an attempt (its delays were sliced there so that a signal ends
    -- them): a waiter woken on a resource still held gave up after the first
    -- wake-up instead of sleeping out the rest of its delay.
    it("lets a release heard during a delay cost the policy no attempt, as outside the host", function()
      local r = "run:wake"
      local key_holder = require("redlock").new { servers = cl.urls }
      local held = assert(key_holder:lock(r, { ttl = 30000 }))
      local name = script("wake.lua", [[
        local dlm = require("redlock").default()
        local calls = {}
        local lock, err = dlm:lock(arg[1], { retry = function(n)
          calls[#calls + 1] = n
          if n <= 2 then return 4000 end
        end })
        print(lock and "got" or err, table.concat(calls, ","))
        if lock then lock:unlock() end
      ]])
      local job = bg("run " .. name .. " " .. r, ENV)
      -- the waiter queued (its first attempt was refused), then a message on
      -- the resource's channel while it is still held: a wake-up, a refused
      -- extra attempt
      assert(eventually(function() return cl:cli(1, "LLEN", "redlock:queue:" .. r) == "1" end, 5000))
      for i = 1, cl.n do cl:cli(i, "PUBLISH", "redlock:released:" .. r, "1") end
      -- released 6 s on: within the policy's second delay (until 8 s from
      -- the first attempt), 2 s after a policy counting wake-ups gave up
      sleep_ms(6000)
      assert(held:unlock())
      key_holder:close()
      local rc, out = job:wait(10000)
      assert.are.equal(0, rc, out)
      assert.matches("^got\t1,2", out)
    end)

    -- Before: the host caught SIGPIPE for its sockets' sake, so a script
    -- printing into a pipe whose reader had gone ran on for ever.
    it("ends as a plain program would (141) when its output's reader goes away, releasing its lock", function()
      local name = script("yes.lua", [[
        local l = assert(require("redlock").default():lock("run:sigpipe", { ttl = 30000 }))
        while true do print("y") end
      ]])
      local out, rc = sh(("cd %s && timeout 20 bash -c %s"):format(q(TMP),
        q(("env %s %s run %s | head -1; echo rc=${PIPESTATUS[0]}"):format(ENV, q(BIN), name))))
      assert.are.equal(0, rc, out)
      assert.matches("^y\nrc=141", out)
      assert.is_true(gone_everywhere("run:sigpipe"))
    end)

    -- The host wraps the lock calls (to undo an acquire a signal interrupts);
    -- misuse must still be reported at the script's line, not the wrapper's.
    it("reports misuse of the lock calls at the script's line", function()
      local name = script("misuse.lua", "local dlm = require('redlock').default()\n\nlocal l = dlm:lock(nil)\n")
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc, out)
      assert.matches("misuse.lua:3: bad argument #1 to 'lock' (resource must be a non-empty string, got nil)", out, 1, true)
      name = script("misuse_many.lua", "local dlm = require('redlock').default()\nlocal g = dlm:lock_many({ 'a', 7 })\n")
      out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc, out)
      assert.matches("misuse_many.lua:2: bad argument #1 to 'lock_many'", out, 1, true)
    end)

    it("reports a runtime error with a traceback, exits 1 and releases held locks", function()
      local name = script("boom.lua", [[
        local dlm = require("redlock").default()
        local lock = assert(dlm:lock("run:boom", { ttl = 30000 }))
        local function deeper() error("something broke") end
        local function work() deeper() end
        work()
      ]])
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc)
      assert.matches("redlock: boom.lua:3: something broke\nstack traceback:", out, 1, true)
      assert.matches("in function 'deeper'", out, 1, true)
      assert.matches("boom.lua:5: in main chunk", out, 1, true)
      assert.is_true(gone_everywhere("run:boom"), "the lock was left behind")
    end)

    it("never drops the error message: a script under a redlock/host/ directory, or thousands of ARGS", function()
      os.execute("mkdir -p " .. q(TMP .. "/job/redlock/host"))
      local name = script("job/redlock/host/fail.lua", "local function f() error('it failed here') end\nf()\n")
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc, out)
      assert.matches("redlock: job/redlock/host/fail.lua:1: it failed here\nstack traceback:", out, 1, true)
      assert.matches("fail.lua:2: in main chunk", out, 1, true)
      local count = script("count.lua", "return select('#', ...) == #arg and 0 or 3\n")
      out, rc = redlock("run " .. count .. " $(seq 1 5000)", ENV)
      assert.are.equal(0, rc, out)
      out, rc = redlock("run " .. count .. " $(seq 1 8000)", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("redlock: too many arguments for count.lua: 8000 (at most 7000)", out, 1, true)
    end)

    it("bad servers are a usage error (64) before the script runs, as for exec and status", function()
      local def = script("usedefault.lua", "print('script ran') require('redlock').default()\n")
      os.execute("mkdir -p " .. q(TMP .. "/servers.d"))
      write_file(TMP .. "/hashpw.servers", "redis://:abcHash#defHash@127.0.0.1:1\n")
      for _, case in ipairs {
        { "--servers bogus://x", "server 1: 'bogus://x': unknown scheme" },
        { "--servers " .. cl.urls[1] .. "," .. cl.urls[1], "one server would vote twice" },
        { "--servers-file servers.d", "cannot read servers.d: Is a directory" },
        { "--servers-file hashpw.servers", "missing host" },
      } do
        local out, rc = redlock("run " .. case[1] .. " " .. def, "-u REDLOCK_SERVERS")
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        assert.matches(case[2], out, 1, true)
        assert.is_nil(out:find("traceback", 1, true), out)
        assert.is_nil(out:find("script ran", 1, true), out)
        assert.is_nil(out:find("Hash", 1, true), out)
      end
    end)

    -- Before: --label 'a b' was a traceback from redlock.hooks (exit 1), and
    -- a prefix in redlock's own keys one from the script's redlock.default().
    it("a bad --label, --prefix or REDLOCK_PREFIX is a usage error (64) naming it, before the script runs", function()
      local def = script("labeldefault.lua", "print('script ran') require('redlock').default()\n")
      for _, case in ipairs {
        { "run --label 'a b' " .. def, ENV, "--label must be 1 to 15 printable characters" },
        { "run --label 'a b' " .. def, "-u REDLOCK_SERVERS", "--label must be 1 to 15 printable characters" },
        { "run --prefix redlock: " .. def, ENV, [[--prefix 'redlock:' starts with "redlock:"]] },
        { "run --prefix redlock: " .. def, "-u REDLOCK_SERVERS", [[--prefix 'redlock:' starts with "redlock:"]] },
        { "run " .. def, ENV .. " REDLOCK_PREFIX=redlock:x", [[REDLOCK_PREFIX 'redlock:x' starts with "redlock:"]] },
        { "exec r -- true", ENV .. " REDLOCK_PREFIX=redlock:x", [[REDLOCK_PREFIX 'redlock:x' starts with "redlock:"]] },
      } do
        local out, rc = redlock(case[1], case[2])
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        assert.matches(case[3], out, 1, true)
        assert.is_nil(out:find("traceback", 1, true), out)
        assert.is_nil(out:find("script ran", 1, true), out)
      end
    end)

    it("reports a syntax error with the file and line, exit 1", function()
      local name = script("syntax.lua", "local x = = 1\n")
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc)
      assert.matches("^redlock: syntax.lua:1: unexpected symbol near '='", out)
    end)

    -- Before: "redlock: error in error handling", the script's error lost.
    it("reports an error object whose __tostring raises or returns no string by its type, exit 1", function()
      for _, ts in ipairs { "error('no')", "return 42" } do
        local name = script("badts.lua", ([[
          local lock = assert(require("redlock").default():lock("run:badts", { ttl = 30000 }))
          error(setmetatable({}, { __tostring = function() %s end }))
        ]]):format(ts))
        local out, rc = redlock("run " .. name, ENV)
        assert.are.equal(1, rc, out)
        assert.matches("(error object is a table value)", out, 1, true)
        assert.is_nil(out:find("error in error handling", 1, true), out)
        assert.is_true(gone_everywhere("run:badts"))
      end
    end)

    -- Before: the traceback ended the message at its NUL ("colored").
    it("shows every control byte of a script's error message as \\xNN, a NUL too", function()
      local name = script("nul.lua", [[error(string.rep("\27[31m", 2) .. "colored\0after the nul")]])
      local out, rc = redlock("run " .. name, ENV)
      assert.are.equal(1, rc, out)
      assert.matches("nul.lua:1: \\x1b[31m\\x1b[31mcolored\\x00after the nul\n", out, 1, true)
    end)

    it("releases held locks on os.exit", function()
      local name = script("exit.lua", [[
        local lock = assert(require("redlock").default():lock("run:exit", { ttl = 30000 }))
        os.exit(3)
      ]])
      local _, rc = redlock("run " .. name, ENV)
      assert.are.equal(3, rc)
      assert.is_true(gone_everywhere("run:exit"))
    end)

    it("inside run, redlock.default() without servers is a usage error (64) that says how to configure them", function()
      local name = script("noservers.lua", "require('redlock').default()\n")
      local out, rc = redlock("run " .. name, "-u REDLOCK_SERVERS")
      assert.are.equal(64, rc, out)
      assert.matches("REDLOCK_SERVERS", out, 1, true)
      assert.matches("redlock dev", out, 1, true)
      assert.is_nil(out:find("traceback", 1, true), out)
      -- a script that catches the error sees the message
      name = script("noservers_caught.lua", "print(pcall(require('redlock').default)) return 5\n")
      out, rc = redlock("run " .. name, "-u REDLOCK_SERVERS")
      assert.are.equal(5, rc, out)
      assert.matches("false\tno servers configured", out, 1, true)
    end)

    it("a script returning a number that is no exit status fails (1) and says so", function()
      for _, v in ipairs { "300", "-1", "1.5", "256" } do
        local name = script("ret.lua", "return " .. v .. "\n")
        local out, rc = redlock("run " .. name, ENV)
        assert.are.equal(1, rc, v .. ": " .. out)
        assert.matches("ret.lua returned " .. v .. ": an exit status is a whole number from 0 to 255",
          out, 1, true)
      end
      local _, rc = redlock("run " .. script("ret255.lua", "return 255\n"), ENV)
      assert.are.equal(255, rc)
    end)

    for _, case in ipairs {
      { sig = "TERM", rc = 143, busy = "os.execute('sleep 30')" },
      { sig = "INT", rc = 130, busy = "local x = 0 while true do x = x + 1 end" },
      { sig = "TERM", rc = 143, busy = "io.open('fifo'):read('*l')" }, -- blocks in open(2)
    } do
      it(("SIG%s while busy in `%s` releases the lock and exits %d"):format(case.sig, case.busy, case.rc),
        function()
          os.execute("rm -f " .. q(TMP .. "/fifo") .. " && mkfifo " .. q(TMP .. "/fifo"))
          local key = "run:signal:" .. case.sig .. #case.busy
          local name = script("busy" .. #case.busy .. ".lua", ([[
            local lock = assert(require("redlock").default():lock(%q, { ttl = 30000 }))
            print("locked") io.stdout:flush()
            %s
          ]]):format(key, case.busy))
          local job = bg("run " .. name, ENV)
          assert.is_true(eventually(function() return job.output():find("locked") end), job.output())
          local held = 0
          for _, v in ipairs(holders(key)) do if v then held = held + 1 end end
          assert.are.equal(5, held)
          sleep_ms(100)
          job:signal(case.sig)
          local rc, out = job:wait(5000)
          assert.are.equal(case.rc, rc, out)
          assert.is_true(gone_everywhere(key), "keys left behind")
        end)
    end

    -- Three of five nodes stopped: every attempt sets the key on the other two
    -- and then waits the whole node timeout (3 s here) for the rest, so the
    -- SIGTERM lands while an attempt is in flight, with its SETs applied.
    it("SIGTERM while dlm:lock is in flight leaves no key behind, exits 143", function()
      local key = "run:inflight:" .. wall_ms()
      local name = script("inflight.lua", ([[
        local servers = {}
        for url in os.getenv("REDLOCK_SERVERS"):gmatch("[^,]+") do servers[#servers + 1] = url end
        local dlm = require("redlock").new { servers = servers, node_timeout = 3000, connect_timeout = 3000 }
        print("locking") io.stdout:flush()
        local lock = dlm:lock(%q, { ttl = 30000 })
        print("returned", lock)
      ]]):format(key))
      finally(function() for i = 3, 5 do cl:kill(i, "CONT") end end)
      for i = 3, 5 do cl:kill(i, "STOP") end
      local job = bg("run " .. name, ENV)
      assert.is_true(eventually(function() return get(1, key) and get(2, key) end, 10000), job.output())
      job:signal("TERM")
      local rc, out = job:wait(20000)
      assert.are.equal(143, rc, out)
      assert.is_nil(get(1, key), "the key was left on node 1")
      assert.is_nil(get(2, key), "the key was left on node 2")
      for i = 3, 5 do cl:kill(i, "CONT") end
      sleep_ms(100)
      assert.is_true(gone_everywhere(key), "keys left behind")
      assert.is_nil(out:find("returned", 1, true), out)
    end)

    -- Between attempts nothing is in flight: a signal then ends the host at
    -- once, rather than waiting for the acquisition (the policy's delay is
    -- 30 s, and the bound for an acquisition in flight 2 x (connect + node
    -- timeout) + 1 s = 41 s with this client's 20 s connect timeout).
    it("SIGTERM during a retry policy's delay ends the host at once, and no attempt follows", function()
      local key = "run:delay:" .. wall_ms()
      local holder = require("redlock").new { servers = cl.urls }
      local held = assert(holder:lock(key, { ttl = 30000 }))
      finally(function() held:unlock() holder:close() end)
      local name = script("delay.lua", ([[
        local servers = {}
        for url in os.getenv("REDLOCK_SERVERS"):gmatch("[^,]+") do servers[#servers + 1] = url end
        local dlm = require("redlock").new { servers = servers, connect_timeout = 20000 }
        local lock = dlm:lock(%q, { retry = function() return 30000 end })
        print("returned", lock)
      ]]):format(key))
      local job = bg("run " .. name, ENV)
      -- its first attempt was refused and it queued: it sleeps the delay now
      assert.is_true(eventually(function() return cl:cli(1, "LLEN", "redlock:queue:" .. key) == "1" end, 10000),
        job.output())
      local evals = cluster.calls(cl, "eval", 1)
      job:signal("TERM")
      local rc, out = job:wait(10000)
      assert.are.equal(143, rc, "still waiting after 10 s: " .. tostring(out))
      assert.is_nil(out:find("returned", 1, true), out)
      assert.are.equal(evals, cluster.calls(cl, "eval", 1),
        "an attempt went out after the signal")
      assert.are.equal(held.value, get(1, key))
    end)

    -- Before: the retry policy ran inside the acquisition (the sleeping
    -- hook came only before the sleep), so a coroutine whose policy yielded
    -- and was never resumed left it open for good: every signal then waited
    -- out the bound for an attempt in flight (41 s with this client).
    it("SIGTERM after a retry policy yielded a coroutine never resumed ends the host at once", function()
      local busy, mine = "run:coyield:busy:" .. wall_ms(), "run:coyield:mine:" .. wall_ms()
      local name = script("coyield.lua", ([[
        local servers = {}
        for url in os.getenv("REDLOCK_SERVERS"):gmatch("[^,]+") do servers[#servers + 1] = url end
        local dlm = require("redlock").default()
        local held = assert(dlm:lock(%q, { ttl = 30000 })) -- so the coroutine finds it busy
        local dlm2 = require("redlock").new { servers = servers, connect_timeout = 20000 }
        local co = coroutine.create(function()
          return dlm2:lock(%q, { ttl = 30000, retry = function(n) coroutine.yield(n) return 10 end })
        end)
        print("yielded", coroutine.resume(co))
        local lock = assert(dlm:lock(%q, { ttl = 30000 }))
        print("locked") io.stdout:flush()
        local t = os.time() + 20
        while os.time() < t do end
      ]]):format(busy, busy, mine))
      local job = bg("run " .. name, ENV)
      finally(function() if not job:wait(0) then job:signal("KILL") end end)
      assert.is_true(eventually(function() return job.output():find("locked", 1, true) end, 10000), job.output())
      assert.matches("yielded\ttrue\t1", job.output(), 1, true)
      local t0 = wall_ms()
      job:signal("TERM")
      local rc, out = job:wait(5000)
      assert.are.equal(143, rc, "still waiting after 5 s: " .. tostring(out))
      assert.is_true(wall_ms() - t0 < 2000, ("exited %d ms after the signal"):format(wall_ms() - t0))
      assert.is_true(gone_everywhere(busy), "the held lock was left behind")
      assert.is_true(gone_everywhere(mine), "the lock was left behind")
    end)

    -- Before: the script's commands got the host's own signal, so one that
    -- ignores SIGINT or SIGHUP (as a shell's background job ignores SIGINT)
    -- held the release back until its SIGKILL 2 s later, and never saw the
    -- SIGTERM the docs promise.
    for _, case in ipairs {
      { sig = "INT", how = "os.execute", run = [[os.execute("sh ./deaf.sh")]] },
      { sig = "HUP", how = "os.execute", run = [[os.execute("sh ./deaf.sh")]] },
      { sig = "QUIT", how = "os.execute", run = [[os.execute("sh ./deaf.sh")]] },
      { sig = "INT", how = "io.popen", run = [[local f = io.popen("sh ./deaf.sh") f:read("*a") f:close()]] },
    } do
      it(("SIG%s gives a command of %s that ignores it SIGTERM, and the lock is free at once")
        :format(case.sig, case.how), function()
        write_file(TMP .. "/deaf.sh", [[
trap '' INT HUP QUIT
trap 'echo command got TERM >&2; exit 0' TERM
sleep 30 &
echo ready >&2
wait
]])
        local key = "run:deaf:" .. case.sig .. ":" .. case.how
        local name = script("deaf" .. case.sig .. ".lua", ([[
          local lock = assert(require("redlock").default():lock(%q, { ttl = 30000 }))
          ]] .. case.run .. [[

        ]]):format(key))
        local job = bg("run " .. name, QUIT_DFL .. " " .. ENV)
        finally(function() if not job:wait(0) then job:signal("KILL") end end)
        assert.is_true(eventually(function() return job.output():find("ready", 1, true) end, 10000), job.output())
        local t0 = wall_ms()
        job:signal(case.sig)
        local rc, out = job:wait(5000)
        local took = wall_ms() - t0
        assert.are.equal(({ INT = 130, HUP = 129, QUIT = 131 })[case.sig], rc, out)
        assert.matches("command got TERM", out, 1, true)
        assert.is_true(took < 1500, ("exited %d ms after the signal"):format(took))
        assert.is_true(gone_everywhere(key), "keys left behind")
      end)
    end

    it("Ctrl-C on a terminal during os.execute still ends the job (130) and releases the lock", function()
      if not sh("command -v script") :find("script") then
        pending("needs script(1) for a pseudo-terminal")
        return
      end
      local name = script("ctrlc.lua", [[
        require("redlock").default():with_lock("run:ctrlc", { ttl = 3000 }, function()
          print("locked") io.stdout:flush()
          io.open("ctrlc.locked", "w"):close()
          os.execute("sleep 20")
          print("went on")
        end)
      ]])
      os.remove(TMP .. "/ctrlc.locked")
      local out = sh(("cd %s && (%s; printf '\\003'; sleep 3) | env %s timeout 30 script -qec %s /dev/null")
        :format(q(TMP), until_file("ctrlc.locked"), ENV, q(q(BIN) .. " run " .. name .. "; echo rc=$?")))
      assert.matches("locked", out, 1, true)
      assert.matches("rc=130", out, 1, true)
      assert.is_nil(out:find("went on", 1, true), out)
      assert.is_true(gone_everywhere("run:ctrlc"))
    end)

    -- Before: Ctrl-\ reached only the command (whose group had the terminal);
    -- the script went on, and Ctrl-\ outside os.execute killed redlock at once,
    -- its lock left on the nodes.
    for _, case in ipairs {
      { during = "os.execute", body = [[os.execute("sleep 20")]] },
      { during = "a read from the terminal", body = [[io.read("*l")]] },
    } do
      it("Ctrl-\\ on a terminal during " .. case.during .. " ends the job (131) and releases the lock", function()
        if not sh("command -v script") :find("script") then
          pending("needs script(1) for a pseudo-terminal")
          return
        end
        -- script(1) runs the line with $SHELL: the shell that reports rc shares
        -- the terminal's group with redlock, and dash would die of the Ctrl-\
        local key = "run:ctrlquit:" .. #case.during
        local flag = "ctrlquit" .. #case.during .. ".locked"
        local name = script("ctrlquit" .. #case.during .. ".lua", ([[
          require("redlock").default():with_lock(%q, { ttl = 30000 }, function()
            print("locked") io.stdout:flush()
            io.open(%q, "w"):close()
            ]] .. case.body .. [[

            print("went on")
          end)
        ]]):format(key, flag))
        os.remove(TMP .. "/" .. flag)
        local line = "trap '' QUIT; env " .. QUIT_DFL .. " " .. q(BIN) .. " run " .. name .. "; echo rc=$?"
        local out = sh(("cd %s && (%s; printf '\\034'; sleep 3) | env %s timeout 30 script -qec %s /dev/null")
          :format(q(TMP), until_file(flag), ENV, q(line)))
        assert.matches("locked", out, 1, true)
        assert.matches("rc=131", out, 1, true)
        assert.is_nil(out:find("went on", 1, true), out)
        assert.is_true(gone_everywhere(key))
      end)
    end

    for _, case in ipairs {
      { sig = "TERM", how = "os.execute", run = [[os.execute("sh ./work%s.sh")]] },
      { sig = "INT", how = "os.execute", run = [[os.execute("sh ./work%s.sh")]] },
      { sig = "HUP", how = "os.execute", run = [[os.execute("sh ./work%s.sh")]] },
      { sig = "QUIT", how = "os.execute", run = [[os.execute("sh ./work%s.sh")]] },
      { sig = "QUIT", how = "io.popen", run = [[local f = io.popen("sh ./work%s.sh") f:read("*a") f:close()]] },
      { sig = "TERM", how = "io.popen", run = [[local f = io.popen("sh ./work%s.sh") f:read("*a") f:close()]] },
    } do
      local sig = case.sig
      it(("SIG%s stops every process %s started before the lock is free"):format(sig, case.how), function()
        -- work.sh forks a background sleep and a shell that writes a marker after its own sleep
        local tag = ("%d%s%d"):format(wall_ms() % 100000, sig, #case.how)
        local digits = tag:gsub("%a", "")
        local bg_arg, fg_arg = "31." .. digits, "3.2" .. digits
        local marker = TMP .. "/tree" .. sig .. case.how .. ".marker"
        write_file(TMP .. "/work" .. sig .. ".sh", ([[
sleep %s &
sh -c 'sleep %s; echo late > %s'
]]):format(bg_arg, fg_arg, q(marker)))
        local key = "run:tree:" .. sig .. ":" .. case.how
        local name = script("tree" .. sig .. case.how .. ".lua", ([[
          require("redlock").default():with_lock(%q, { ttl = 3000 }, function()
            print("locked") io.stdout:flush()
            ]] .. case.run .. [[

          end)
        ]]):format(key, sig))
        local job = bg("run " .. name, QUIT_DFL .. " " .. ENV)
        assert.is_true(eventually(function()
          return #proc.live_with_arg(bg_arg) == 1 and #proc.live_with_arg(fg_arg) == 1
        end), job.output())
        job:signal(sig)
        -- the moment a second holder gets the lock, nothing of the job's tree may run
        local acquired, left
        assert.is_true(eventually(function()
          local _, rc = redlock("exec -n -q " .. key .. " -- true", ENV)
          if rc ~= 0 then return false end
          acquired = true
          left = #proc.live_with_arg(bg_arg) + #proc.live_with_arg(fg_arg)
          return true
        end, 10000), "the lock never became free")
        assert.is_true(acquired)
        local rc, out = job:wait(5000)
        assert.are.equal(({ TERM = 143, INT = 130, HUP = 129, QUIT = 131 })[sig], rc, out)
        assert.are.equal(0, left, "processes of the job ran on after the lock was free")
        sleep_ms(3500)
        assert.is_nil(read_file(marker), "the job's child wrote after the lock was free")
        for _, pid in ipairs(proc.live_with_arg(bg_arg)) do proc.kill(pid, "KILL") end
      end)
    end
  end)

  describe("exec", function()
    it("passes the lock in the environment and exits with the command's status", function()
      local out, rc = redlock([[exec env:r -- sh -c 'echo "$REDLOCK_RESOURCE $REDLOCK_VALUE $REDLOCK_VALIDITY_MS"; ]]
        .. [[redis-cli -p ]] .. cl.ports[1] .. [[ GET env:r; exit 7']], ENV)
      assert.are.equal(7, rc, out)
      local res, value, validity, seen = out:match("^(%S+) (%S+) (%d+)\n(%S+)")
      assert.are.equal("env:r", res, out)
      assert.are.equal(40, #value)
      assert.are.equal(value, seen)
      assert.is_true(tonumber(validity) > 9000, out)
      assert.is_true(gone_everywhere("env:r"))
      -- -v says the whole value (before: its first 8 characters, the label alone) and the ttl
      out, rc = redlock([[exec -v --ttl 20s env:r -- sh -c 'echo "$REDLOCK_VALUE $REDLOCK_TTL_MS"']], ENV)
      assert.are.equal(0, rc, out)
      value = ("\n" .. out):match("\n(%S+) 20000\n")
      assert.is_truthy(value, out)
      assert.matches("redlock: locked 'env:r' (value " .. value .. ", valid ", out, 1, true)
    end)

    it("exits 128+N when the command dies of signal N, 127/126 when it cannot run", function()
      local _, rc = redlock("exec sig:r -- sh -c 'kill -9 $$'", ENV)
      assert.are.equal(137, rc)
      local out
      out, rc = redlock("exec sig:r -- no-such-command-here", ENV)
      assert.are.equal(127, rc)
      assert.matches("no-such-command-here: command not found", out, 1, true)
      _, rc = redlock("exec sig:r -- /etc/passwd", ENV)
      assert.are.equal(126, rc)
      assert.is_true(gone_everywhere("sig:r"))
    end)

    -- Before: redlock installed its SIGHUP handler and gave the command SIGHUP
    -- at default whatever its caller had ignored, so `nohup redlock exec`
    -- died of a hangup (129) and took the command with it.
    -- Before: -w was taken for the command, after the lock was taken without it.
    it("refuses an option after RESOURCE as a usage error, before locking", function()
      local out, rc = redlock("exec opt:r -w 10s -- echo ran", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("options go before RESOURCE", out, 1, true)
      assert.is_nil(out:find("ran", 1, true))
      assert.is_true(gone_everywhere("opt:r"))
    end)

    -- Before: exit 1 ("held elsewhere") with a Lua traceback.
    it("refuses a RESOURCE longer than a key may be as a usage error (64)", function()
      local out, rc = redlock("exec " .. string.rep("a", 70000) .. " -- true", ENV)
      assert.are.equal(64, rc, out:sub(1, 300))
      assert.matches("RESOURCE is 70000 bytes long", out, 1, true)
      assert.is_nil(out:find("traceback", 1, true))
    end)

    -- (SIGQUIT: as a non-interactive shell's `cmd &` starts it.)
    for _, sig in ipairs { "HUP", "QUIT" } do
      it(("leaves a SIG%s its caller ignored ignored, in itself and in the command"):format(sig), function()
        local key = "ignored" .. sig .. ":r"
        write_file(TMP .. "/ignored" .. sig .. ".sh",
          ("kill -%s $$; kill -%s $PPID; sleep 0.3; echo survived\n"):format(sig, sig))
        local out, rc = sh(("cd %s && trap '' %s && env %s %s exec %s -- sh ./ignored%s.sh")
          :format(q(TMP), sig, ENV, q(BIN), key, sig))
        assert.are.equal(0, rc, out)
        assert.matches("survived", out, 1, true)
        assert.is_true(gone_everywhere(key))
      end)
    end

    -- A run script's commands too, and redlock run itself.
    it("leaves a SIGQUIT its caller ignored ignored in redlock run and in os.execute's command", function()
      local name = script("ignoredquit.lua", [[
        local lock = assert(require("redlock").default():lock("ignoredquit:run", { ttl = 10000 }))
        os.execute("kill -QUIT $$; kill -QUIT $PPID; sleep 0.3; echo survived")
        lock:unlock()
        print("script went on")
      ]])
      local out, rc = sh(("cd %s && trap '' QUIT && env %s %s run %s"):format(q(TMP), ENV, q(BIN), name))
      assert.are.equal(0, rc, out)
      assert.matches("survived\nscript went on", out, 1, true)
      assert.is_true(gone_everywhere("ignoredquit:run"))
    end)

    it("-n on a held resource exits with the conflict status at once; -w gives up after MS", function()
      local holder = bg("exec held:r -- sleep 3", ENV)
      assert.is_true(eventually(function() return get(1, "held:r") ~= nil end))
      local out, rc, took = redlock("exec -n held:r -- echo ran", ENV)
      assert.are.equal(1, rc, out)
      assert.is_nil(out:find("ran", 1, true))
      assert.matches("held elsewhere", out, 1, true)
      assert.is_true(took < 500, "took " .. took .. " ms")
      out, rc = redlock("exec -n -E 42 held:r -- true", ENV)
      assert.are.equal(42, rc, out)
      out, rc, took = redlock("exec -w 400 --conflict-exit-code 9 held:r -- true", ENV)
      assert.are.equal(9, rc, out)
      assert.is_true(took >= 400 and took < 1500, "took " .. took .. " ms")
      assert.are.equal(0, (holder:wait(10000)))
    end)

    it("waits for a held resource by default and then runs", function()
      local holder = bg("exec wait:r -- sleep 1", ENV)
      assert.is_true(eventually(function() return get(1, "wait:r") ~= nil end))
      local out, rc, took = redlock("exec wait:r -- echo ran", ENV)
      assert.are.equal(0, rc, out)
      assert.matches("ran", out, 1, true)
      assert.is_true(took > 400, "took " .. took .. " ms")
      assert.are.equal(0, (holder:wait(5000)))
    end)

    it("waiting on a lock held elsewhere is silent, even for seconds", function()
      local holder = bg("exec quietwait:r -- sleep 3", ENV)
      assert.is_true(eventually(function() return get(1, "quietwait:r") ~= nil end))
      local out, rc = redlock("exec quietwait:r -- echo ran", ENV)
      assert.are.equal(0, rc, out)
      assert.are.equal("ran\n", out)
      assert.are.equal(0, (holder:wait(5000)))
    end)

    it("says on stderr, node by node, within seconds and then every 10 s, that no quorum can be reached", function()
      local servers = "redis://127.0.0.1:1,redis://no-such-host.invalid:6379,redis://:pw@127.0.0.1:2"
      local job = bg("exec --servers " .. servers .. " unreachable:r -- echo ran", "")
      local function reports() return select(2, job.output():gsub("cannot lock 'unreachable:r'", "")) end
      assert.is_true(eventually(function() return reports() >= 1 end, 10000), job.output())
      local out = job.output()
      assert.matches("still trying", out, 1, true)
      assert.matches("redis://127.0.0.1:1: error (connect failed: Connection refused)", out, 1, true)
      assert.matches("redis://no-such-host.invalid:6379: error (name resolution failed", out, 1, true)
      assert.matches("redis://127.0.0.1:2", out, 1, true)
      assert.is_nil(out:find("pw", 1, true), out)
      assert.is_true(eventually(function() return reports() >= 2 end, 20000), job.output())
      job:signal("TERM")
      assert.are.equal(143, (job:wait(5000)))
      assert.is_nil(job.output():find("ran", 1, true))
    end)

    -- Before: a node's error text reached the terminal raw: its escape
    -- sequences retitled the window, cleared the screen and coloured the rest.
    it("shows a node's error with its control bytes as \\xNN, in exec's and run's failures", function()
      local a, b = faults.fakeserver("escape"), faults.fakeserver("escape")
      finally(function() a:stop(); b:stop() end)
      local servers = table.concat({ a.url, b.url, cl.urls[1] }, ",")
      local out, rc = redlock("exec -n --servers " .. servers .. " units:escape -- true", "")
      assert.are.equal(69, rc, out)
      assert.matches("node 1 " .. a.url .. ": error (ERR \\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mRED)", out, 1, true)
      assert.is_nil(out:find("[\27\7]"), out)
      local name = script("escape.lua", [[
        local lock, err, detail = require("redlock").default():try_lock("units:escape")
        error("the node said: " .. detail[1].error)
      ]])
      out, rc = redlock("run --servers " .. servers .. " " .. name, "")
      assert.are.equal(1, rc, out)
      assert.matches("the node said: ERR \\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mRED\n", out, 1, true)
      assert.matches("stack traceback:\n\t", out, 1, true) -- newlines and tabs stay
      assert.is_nil(out:find("[\27\7]"), out)
    end)

    -- Before: exec waited 2 s for the node it could never reach on SIGTERM
    -- (its exit paths waited 2000 ms for kept locks, where host.md says about
    -- 1 s), and 4 s after its command when a node was still sending a reply.
    it("leaves within about 1 s on SIGTERM with a node that never answers; its lock released", function()
      local silent = faults.fakeserver("silent")
      finally(function() silent:stop() end)
      local servers = table.concat({ silent.url, cl.urls[1], cl.urls[2] }, ",")
      for run = 1, 2 do
        local key = "units:silentterm" .. run
        local job = bg("exec --servers " .. servers .. " " .. key .. " -- sleep 30", "")
        assert.is_true(eventually(function() return get(1, key) ~= nil and get(2, key) ~= nil end), job.output())
        sleep_ms(300) -- the keep-alive thread's connections are up, and its release for the silent node waits
        local t0 = wall_ms()
        job:signal("TERM")
        local rc = job:wait(10000)
        local took = wall_ms() - t0
        assert.are.equal(143, rc, job.output())
        assert.is_true(took < 1700, ("run %d: exit %d ms after SIGTERM"):format(run, took))
        assert.is_true(get(1, key) == nil and get(2, key) == nil)
      end
    end)

    it("leaves soon after its command with a node sending a reply that does not end", function()
      local drip = faults.fakeserver("drip")
      finally(function() drip:stop() end)
      local servers = table.concat({ drip.url, cl.urls[1], cl.urls[2] }, ",")
      for run = 1, 2 do
        local out, rc, took = redlock("exec --servers " .. servers .. " units:drip" .. run .. " -- true", "")
        assert.are.equal(0, rc, out)
        assert.is_true(took < 1800, ("run %d: took %d ms"):format(run, took))
      end
    end)

    it("never lets two commands on one resource overlap", function()
      local log = TMP .. "/overlap.log"
      local child = ([[sh -c 'echo "enter $$ $(date +%%s%%N)" >> %s; sleep 0.05; echo "exit $$ $(date +%%s%%N)" >> %s']])
        :format(log, log)
      local jobs = {}
      for w = 1, 3 do
        jobs[w] = bg(("run %s %s"):format(script("loop" .. w .. ".lua", ([[
          for i = 1, 6 do
            local rc = os.execute(%q)
            assert(rc == 0, "exec failed: " .. tostring(rc))
          end
        ]]):format(q(BIN) .. " exec overlap:r -- " .. child)), ""), ENV)
      end
      for w = 1, 3 do assert.are.equal(0, (jobs[w]:wait(30000))) end
      local intervals, open = {}, {}
      for kind, pid, t in (read_file(log) or ""):gmatch("(%a+) (%d+) (%d+)") do
        t = tonumber(t)
        if kind == "enter" then open[pid] = t else intervals[#intervals + 1] = { open[pid], t } end
      end
      assert.are.equal(18, #intervals)
      table.sort(intervals, function(a, b) return a[1] < b[1] end)
      for i = 2, #intervals do
        assert.is_true(intervals[i][1] >= intervals[i - 1][2], "two holders at once")
      end
    end)

    it("keeps the lock while a command runs 3x longer than the ttl", function()
      local job = bg("exec --ttl 600ms --grace 100 long:r"
        .. " -- sh -c 'echo $REDLOCK_VALUE > long.value; sleep 1.8; echo > long.done'", ENV)
      assert.is_true(eventually(function() return (read_file(TMP .. "/long.value") or ""):match("%S+") end))
      local value = read_file(TMP .. "/long.value"):match("%S+")
      local started = proc.now_ms()
      local held_late = nil -- ms after the start at which a quorum (3 of 5) last held our value
      while true do
        local rc = tonumber(read_file(TMP .. "/bg" .. bg_count .. ".rc") or "")
        if rc then
          assert.are.equal(0, rc, job.output())
          break
        end
        local n = 0
        for _, v in ipairs(holders("long:r")) do if v == value then n = n + 1 end end
        -- the command may have ended (and the lock been released) before
        -- the holders were read: it says so before the host releases
        if n < 3 and not read_file(TMP .. "/long.done") then
          error(("only %d nodes hold our value %d ms after the start"):format(n, proc.now_ms() - started))
        end
        if n >= 3 then held_late = proc.now_ms() - started end
        sleep_ms(50)
      end
      -- without extensions the keys would be gone 600 ms after the start
      assert.is_true(held_late ~= nil and held_late > 800,
        "last seen on a quorum " .. tostring(held_late) .. " ms after the start")
      assert.is_true(gone_everywhere("long:r"))
    end)

    -- grace: what the host uses, given with --grace unless derived (ttl 2000:
    -- half of it less a safety margin of 100 ms)
    for _, case in ipairs {
      { what = "a command that obeys SIGTERM stops", trap = "exit 0", killed = false, ttl = 1500, grace = 300 },
      { what = "a command that ignores SIGTERM is SIGKILLed after the grace period", trap = "", killed = true,
        ttl = 1500, grace = 300 },
      { what = "without --grace, a short --ttl's derived grace period applies", trap = "", killed = true,
        ttl = 2000, grace = 900, derived = true },
    } do
      it("lock lost (nodes silent): " .. case.what .. ", before the validity runs out; exit 75", function()
        local key = ("silent:%d:%s"):format(case.ttl, tostring(case.killed))
        local marks = TMP .. "/" .. key .. ".marks"
        -- the trap runs once the current sleep ends: short sleeps date SIGTERM closely
        local child = script(key .. ".sh", ([[
trap 'echo TERM $(date +%%s%%3N) >> %s; %s' TERM
echo start >> %s
i=0; while [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
echo end >> %s
]]):format(marks, case.trap, marks, marks))
        local job = bg(("exec --ttl %d %s %s -- sh %s"):format(case.ttl,
          case.derived and "" or ("--grace " .. case.grace), key, child), ENV)
        assert.is_true(eventually(function() return (read_file(marks) or ""):find("start") end))
        sleep_ms(200)
        -- a majority stops answering: no extension can succeed from here, so
        -- the validity ends at most ttl ms after the last one, before now
        finally(function() for i = 3, 5 do cl:kill(i, "CONT") end end)
        for i = 3, 5 do cl:kill(i, "STOP") end
        local silent_at = wall_ms()
        local rc, out = job:wait(5000)
        local exited_at = wall_ms()
        assert.are.equal(75, rc, out)
        -- the grace period, or what is left of it before the validity's safety margin
        local grace = tonumber(out:match(("lock on '%s' lost; stopped sh %%(pid %%d+%%): SIGTERM, SIGKILL after (%%d+) ms")
          :format(key:gsub("%p", "%%%0"))))
        assert(grace and grace > 0 and grace <= case.grace, out)
        local term_at = tonumber((read_file(marks) or ""):match("TERM (%d+)"))
        assert.is_not_nil(term_at, "the command got no SIGTERM")
        -- SIGTERM must leave the grace period before the validity ends
        assert.is_true(term_at - silent_at < case.ttl - case.grace,
          ("SIGTERM %d ms after the nodes stopped"):format(term_at - silent_at))
        assert.is_true(exited_at - silent_at < case.ttl, ("exit %d ms after the nodes stopped"):format(exited_at - silent_at))
        assert.is_nil((read_file(marks) or ""):find("end"), "the command ran to its end")
        if case.killed then
          assert.is_true(exited_at - term_at >= grace,
            ("SIGKILL %d ms after SIGTERM, before the grace period ended"):format(exited_at - term_at))
        else
          assert.is_true(exited_at - term_at < grace, "waited the grace period for a command that had exited")
        end
      end)
    end

    -- Before: a lock whose keys were taken over still counted the validity
    -- of its last extension, and COMMAND got SIGTERM and the grace period
    -- (2 s by default) beside the new holder.
    it("lock stolen (our value gone from a quorum): SIGKILL at once, no SIGTERM; exit 75", function()
      local key = "stolen:r"
      local marks = TMP .. "/stolen.marks"
      local child = marking_script("stolen.sh", marks, 500)
      local job = bg(("exec --ttl 3000 %s -- sh %s"):format(key, child), ENV)
      assert.is_true(eventually(function() return (read_file(marks) or ""):find("start") end))
      -- steal it by hand on a majority (SET replaces our value)
      for i = 1, 3 do cl:cli(i, "SET", key, "thief", "PX", "10000") end
      local stolen_at = wall_ms()
      local rc, out = job:wait(5000)
      local exited_at = wall_ms()
      assert.are.equal(75, rc, out)
      assert.matches("lock on 'stolen:r' lost; stopped sh %(pid %d+%): SIGKILL %(no validity left%)", out)
      assert.is_nil((read_file(marks) or ""):find("TERM"), "the command got SIGTERM")
      assert.is_nil((read_file(marks) or ""):find("end"), "the command ran to its end")
      -- found by the next extension (every ttl/3), not at the validity's end
      assert.is_true(exited_at - stolen_at < 3000, ("exit %d ms after the theft"):format(exited_at - stolen_at))
      for i = 1, 3 do assert.are.equal("thief", get(i, key)) end
    end)

    it("with a short --ttl and no --grace, runs the command (the grace period fits the ttl)", function()
      local out, rc = redlock("exec --ttl 1000 short:r -- echo ran", ENV)
      assert.are.equal(0, rc, out)
      assert.matches("ran", out, 1, true)
      assert.is_true(gone_everywhere("short:r"))
    end)

    it("a --grace that does not fit the ttl, or a ttl too short for any, is a usage error (64)", function()
      local out, rc = redlock("exec --ttl 1000 --grace 451 short:r -- echo ran", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("--grace 451 ms is too long for --ttl 1000 ms", out, 1, true)
      assert.matches("--grace 450 at most", out, 1, true)
      assert.is_nil(out:find("ran\n", 1, true))
      out, rc = redlock("exec --ttl 39 short:r -- echo ran", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("--ttl 39 ms is too short: exec needs at least 40 ms", out, 1, true)
      -- the shortest ttl is accepted (whether the lock survives 40 ms is up to the machine)
      out, rc = redlock("exec --ttl 40 short:r -- true", ENV)
      assert.are_not.equal(64, rc, out)
      assert.is_nil(out:find("too short", 1, true), out)
      assert.is_nil(out:find("too long", 1, true), out)
    end)

    -- Before: SIGQUIT (Ctrl-\) ended redlock at once (131), its command ran on
    -- and the lock stayed on the nodes for the rest of its ttl.
    for _, case in ipairs { { sig = "TERM", rc = 143 }, { sig = "QUIT", rc = 131 } } do
      it(("SIG%s to redlock gives the command SIG%s, releases the lock on every node, exits %d")
        :format(case.sig, case.sig, case.rc), function()
        local marks = TMP .. "/host" .. case.sig .. ".marks"
        local key = "host" .. case.sig .. ":r"
        local job = bg(([[exec --grace 300 %s -- sh -c 'trap "echo %s >> %s; exit 0" %s; echo start >> %s; ]]
          .. [[while :; do sleep 0.05; done']]):format(key, case.sig, marks, case.sig, marks), QUIT_DFL .. " " .. ENV)
        finally(function() if not job:wait(0) then job:signal("KILL") end end)
        assert.is_true(eventually(function() return (read_file(marks) or ""):find("start") end))
        local n = 0
        for _, v in ipairs(holders(key)) do if v then n = n + 1 end end
        assert.are.equal(5, n)
        job:signal(case.sig)
        local rc, out = job:wait(5000)
        assert.are.equal(case.rc, rc, out)
        assert.matches(case.sig, read_file(marks), 1, true)
        assert.is_true(gone_everywhere(key))
      end)
    end

    it("SIGQUIT to redlock while it waits for a held resource ends it (131) before the command runs", function()
      local holder = bg("exec quitwait:r -- sleep 2", ENV)
      assert.is_true(eventually(function() return get(1, "quitwait:r") ~= nil end))
      local held = get(1, "quitwait:r")
      local job = bg("exec quitwait:r -- echo ran", QUIT_DFL .. " " .. ENV)
      finally(function() if not job:wait(0) then job:signal("KILL") end end)
      sleep_ms(300)
      assert.is_nil(job:wait(0), "exec did not wait for the held resource")
      job:signal("QUIT")
      local rc, out = job:wait(5000)
      assert.are.equal(131, rc, out)
      assert.is_nil(out:find("ran", 1, true), out)
      assert.are.equal(held, get(1, "quitwait:r"), "the holder's lock was touched")
      assert.are.equal(0, (holder:wait(5000)))
      assert.is_true(gone_everywhere("quitwait:r"))
    end)

    it("a command does not outlive a SIGKILLed redlock", function()
      local job = bg("exec orphan:r -- sh -c 'echo $$ > orphan.pid; exec sleep 30'", ENV)
      assert.is_true(eventually(function() return tonumber(read_file(TMP .. "/orphan.pid") or "") end))
      local child = tonumber(read_file(TMP .. "/orphan.pid"))
      job:signal("KILL")
      assert.are.equal(137, (job:wait(5000)))
      assert.is_true(eventually(function()
        local stat = read_file("/proc/" .. child .. "/stat")
        return not stat or stat:match("^%d+ %b() (%a)") == "Z"
      end, 2000), "the command still runs without its lock")
    end)

    it("a SIGKILLed redlock takes the command's whole process group with it, well within the ttl", function()
      local tag = tostring(wall_ms() % 100000)
      local marker = TMP .. "/killgroup.marker"
      -- the command forks a background sleep and a shell that writes after its own sleep
      local job = bg(("exec --ttl 6000 killgroup:r -- sh -c 'echo $$ > killgroup.pid; sleep 61.%s & "
        .. [[sh -c "sleep 2.%s; echo late > %s"; wait']]):format(tag, tag, marker), ENV)
      local pgrp
      assert.is_true(eventually(function()
        pgrp = tonumber(read_file(TMP .. "/killgroup.pid") or "")
        return pgrp and #proc.live_with_arg("61." .. tag) == 1 and #proc.live_with_arg("2." .. tag) == 1
      end), job.output())
      assert.is_true(#proc.live_in_group(pgrp) >= 4)
      local t0 = wall_ms()
      job:signal("KILL")
      assert.are.equal(137, (job:wait(5000)))
      -- the grace period is 2000 ms; the validity left is at least ttl/2 = 3000 ms
      assert.is_true(eventually(function() return #proc.live_in_group(pgrp) == 0 end, 10000),
        "the command's group outlived redlock")
      local took = wall_ms() - t0
      assert.is_true(took < 3000, ("the group was stopped %d ms after redlock died"):format(took))
      sleep_ms(3000)
      assert.is_nil(read_file(marker), "the command's child wrote after redlock died")
      for _, pid in ipairs(proc.live_in_group(pgrp)) do proc.kill(pid, "KILL") end
    end)

    -- Before: the watcher was in redlock's own process group, and a SIGKILL to
    -- that group (`timeout -s KILL`, `kill -9 %job`, a supervisor ending the
    -- job) took it along: what COMMAND had started ran on, unlocked.
    it("a SIGKILL to redlock's whole process group does not take the watcher with it", function()
      local tag = tostring(wall_ms() % 100000)
      -- setsid: redlock leads a group (and session) of its own, as a job does
      local job = bg(("exec --ttl 6000 --grace 300 groupkill:r -- sh -c 'echo $$ > groupkill.pid; "
        .. "sleep 62.%s & wait'"):format(tag), ENV, "setsid")
      local pgrp
      assert.is_true(eventually(function()
        pgrp = tonumber(read_file(TMP .. "/groupkill.pid") or "")
        return pgrp and #proc.live_with_arg("62." .. tag) == 1
      end), job.output())
      finally(function()
        for _, pid in ipairs(proc.live_in_group(pgrp)) do proc.kill(pid, "KILL") end
      end)
      assert.are.equal(job.pid, tonumber(proc.sh("ps -o pgid= -p " .. job.pid):match("%d+")))
      proc.kill(-job.pid, "KILL")
      assert.are.equal(137, (job:wait(5000)))
      assert.is_true(eventually(function() return #proc.live_in_group(pgrp) == 0 end, 3000),
        "the command's group outlived redlock's")
    end)

    -- Before: -v's "keeping ..." message went through a redaction whose
    -- patterns took time quadratic in a run of letters: with a 30 kB
    -- RESOURCE the supervision stalled 6 to 8 s there, and the group ran on
    -- that long after its lock was lost (ttl 1.5 s).
    it("-v with a 30 kB RESOURCE: a lost lock still stops what COMMAND left running, in time", function()
      local tag = tostring(wall_ms() % 100000)
      local r = ("r"):rep(30000)
      local job = bg(("exec -v --ttl 1500 %s -- sh -c 'sleep 63.%s & exit 0'"):format(r, tag), ENV)
      assert.is_true(eventually(function() return #proc.live_with_arg("63." .. tag) == 1 end), job.output())
      finally(function() for _, pid in ipairs(proc.live_with_arg("63." .. tag)) do proc.kill(pid, "KILL") end end)
      sleep_ms(500)
      for i = 1, cl.n do cl:cli(i, "FLUSHALL") end -- the lock's keys go: lost at the next extension
      local lost_at = wall_ms()
      assert.is_true(eventually(function() return #proc.live_with_arg("63." .. tag) == 0 end, 15000))
      local took = wall_ms() - lost_at
      local rc, out = job:wait(5000)
      assert.are.equal(75, rc, out)
      assert.is_true(took < 1500, ("the group ran %d ms after its lock was lost"):format(took))
    end)

    -- Before: the message about a lost lock went to stderr before COMMAND was
    -- stopped, and a stderr nobody read (a full pipe) blocked it there: COMMAND
    -- ran on past the validity, beside the next holder.
    it("lock lost: stops COMMAND in time though its stderr is a full pipe nobody reads", function()
      local fifo, captured, marks = TMP .. "/fullerr.fifo", TMP .. "/fullerr.captured", TMP .. "/fullerr.marks"
      assert.is_true(os.execute("mkfifo " .. q(fifo)) == 0)
      -- the reader has the pipe open from the start, and reads only after 5 s
      os.execute(("cd %s && sh -c 'echo $$ > fullerr.reader; sleep 5; exec cat > %s' < %s > /dev/null 2>&1 &")
        :format(q(TMP), q(captured), q(fifo)))
      finally(function()
        local reader = tonumber(read_file(TMP .. "/fullerr.reader") or "")
        if reader then proc.stop(reader) end
      end)
      -- COMMAND fills the pipe (64 KiB), then works, dating each step
      local child = script("fullerr.sh", ([[
head -c 65536 /dev/zero >&2
exec 2>/dev/null
i=0; while [ $i -lt 500 ]; do date +%%s%%3N >> %s; sleep 0.01; i=$((i+1)); done
echo end >> %s
]]):format(q(marks), q(marks)))
      os.execute(("cd %s && ( env %s %s exec --ttl 1500 --grace 300 fullerr:r -- sh %s 2>%s > fullerr.out;"
        .. " echo $? > fullerr.rc ) < /dev/null > /dev/null 2>&1 &"):format(q(TMP), ENV, q(BIN), child, q(fifo)))
      assert.is_true(eventually(function() return (read_file(marks) or ""):find("\n") end), "COMMAND did not start")
      sleep_ms(200)
      finally(function() for i = 3, 5 do cl:kill(i, "CONT") end end)
      for i = 3, 5 do cl:kill(i, "STOP") end
      local silent_at = wall_ms()
      assert.is_true(eventually(function() return read_file(TMP .. "/fullerr.rc") end, 10000), "exec did not end")
      local last = 0
      for t in (read_file(marks) or ""):gmatch("(%d+)\n") do last = math.max(last, tonumber(t)) end
      assert.is_nil((read_file(marks) or ""):find("end"), "the command ran to its end")
      assert.is_true(last - silent_at < 1500, ("COMMAND worked %d ms after the nodes stopped"):format(last - silent_at))
      assert.are.equal("75", (read_file(TMP .. "/fullerr.rc"):match("%d+")))
      assert.is_true(eventually(function() return (read_file(captured) or ""):find("lost; stopped sh", 1, true) end))
    end)

    -- Before: exec released the lock as soon as the command itself exited,
    -- while what it had left running in its process group (`cmd &`) went on
    -- unprotected: the keys were gone at once and exec exited 0.
    it("keeps the lock, extended past the ttl, until the command's whole process group has exited;"
      .. " then releases it and exits with the command's status", function()
      local job = bg([[exec --ttl 2000 group:keep -- sh -c 'echo $REDLOCK_VALUE > keep.value; ]]
        .. [[sleep 7 & echo $! > keep.pid; exit 0']], ENV)
      local value, sleeper
      assert.is_true(eventually(function()
        value = (read_file(TMP .. "/keep.value") or ""):match("%S+")
        sleeper = tonumber(read_file(TMP .. "/keep.pid") or "")
        return value and sleeper
      end), job.output())
      finally(function() proc.kill(sleeper, "KILL") end)
      local t0 = proc.now_ms()
      local held_for -- ms after t0 at which a quorum was last seen holding our value while sleep ran
      while proc.alive(sleeper) do
        local done = read_file(TMP .. "/bg" .. bg_count .. ".rc")
        local n = 0
        for _, v in ipairs(holders("group:keep")) do if v == value then n = n + 1 end end
        if proc.alive(sleeper) then -- so it ran while both were read
          assert.is_nil(done, "exec exited while the command's background sleep still ran:\n" .. job.output())
          assert.is_true(n >= 3, ("%d nodes hold our value %d ms after the start, while the command's "
            .. "background sleep still runs"):format(n, proc.now_ms() - t0))
          held_for = proc.now_ms() - t0
        end
        sleep_ms(100)
      end
      -- without extensions the keys would be gone 2000 ms after they were set
      assert.is_true(held_for ~= nil and held_for > 3000, "last seen held " .. tostring(held_for) .. " ms after the start")
      local rc, out = job:wait(10000)
      assert.are.equal(0, rc, out)
      assert.is_true(gone_everywhere("group:keep"))
    end)

    -- Before: started with SIGCHLD ignored (a caller's setting, inherited),
    -- the kernel reaped COMMAND: exec exited 1 the moment sh ended, released
    -- the lock while the group's background job still ran (a second holder
    -- got in), and `sh -c 'exit 5'` gave 1; os.execute in a script gave -1.
    it("started with SIGCHLD ignored, keeps the lock for the command's process group and exits with its status",
      function()
      local job = bg([[exec group:ignchld -- sh -c 'sleep 2 & echo $! > ignchld.pid; exit 5']], ENV,
        "env --ignore-signal=CHLD")
      local sleeper
      assert.is_true(eventually(function()
        sleeper = tonumber(read_file(TMP .. "/ignchld.pid") or "")
        return sleeper
      end), job.output())
      finally(function() proc.kill(sleeper, "KILL") end)
      sleep_ms(300)
      assert.is_true(proc.alive(sleeper))
      assert.is_nil(job:wait(0), "exec exited while the command's background sleep still ran:\n" .. job.output())
      assert.is_not_nil(get(1, "group:ignchld"))
      local rc, out = job:wait(10000)
      assert.are.equal(5, rc, out)
      assert.is_true(gone_everywhere("group:ignchld"))
      script("ignchld.lua", [[print(os.execute("exit 3"))]]) -- LuaJIT: the wait status, 3 << 8
      out, rc = redlock("run ignchld.lua", "--ignore-signal=CHLD " .. ENV)
      assert.are.equal(0, rc, out)
      assert.are.equal("768\n", out)
    end)

    -- Before: started with them blocked (the mask is inherited), redlock
    -- never saw SIGTERM: the command ran to its end and exec exited 0.
    it("started with SIGINT, SIGTERM, SIGHUP and SIGQUIT blocked, still ends on SIGTERM (143), lock released",
      function()
      local job = bg("exec blocked:r -- sleep 30", ENV, "env --block-signal=INT,TERM,HUP,QUIT")
      finally(function() if not job:wait(0) then job:signal("KILL") end end)
      assert.is_true(eventually(function() return get(1, "blocked:r") ~= nil end), job.output())
      job:signal("TERM")
      local rc, out = job:wait(5000)
      assert.are.equal(143, rc, out)
      assert.is_true(gone_everywhere("blocked:r"))
    end)

    -- Before: a path longer than 4095 bytes was cut there, and the program at
    -- the cut ran under the lock (here /bin/echo, exit 0).
    it("a command path too long to use is an error (126), not another program", function()
      local path = "/" .. ("./"):rep(2043) .. "bin/echo" -- 4095 bytes
      local out, rc = redlock("exec longpath:r -- " .. q(path .. "-not-this"), ENV)
      assert.are.equal(126, rc, out)
      assert.matches("File name too long", out, 1, true)
      assert.is_true(gone_everywhere("longpath:r"))
    end)

    it("with --kill-group, stops what the command left in its process group (SIGTERM, then SIGKILL"
      .. " after the grace period), then releases and exits with the command's status", function()
      local tag = tostring(wall_ms() % 100000)
      local marks = TMP .. "/killgroup2.marks"
      os.remove(marks)
      -- a member that obeys SIGTERM, and one that ignores it and says so every
      -- 10 ms; the command exits once the second has set its trap (else a
      -- SIGTERM could come first, and end it by default)
      write_file(TMP .. "/killgroup2.sh", ([[
echo $$ > killgroup2.pgid
sleep 31.%s &
( trap 'echo TERM >> %s' TERM; echo ready >> %s; while :; do sleep 0.01; echo tick >> %s; done ) &
while ! grep -q ready %s 2>/dev/null; do sleep 0.01; done
exit 3
]]):format(tag, q(marks), q(marks), q(marks), q(marks)))
      local job = bg("exec -v --kill-group --grace 300 --ttl 2000 group:kill -- sh killgroup2.sh", ENV)
      local rc, out = job:wait(10000)
      local pgrp = tonumber(read_file(TMP .. "/killgroup2.pgid") or "")
      finally(function()
        for _, pid in ipairs(pgrp and proc.live_in_group(pgrp) or {}) do proc.kill(pid, "KILL") end
      end)
      assert.are.equal(3, rc, out)
      assert.matches("stopped the rest of its process group", out, 1, true)
      assert.are.equal(0, #proc.live_in_group(pgrp), "part of the group outlived exec")
      assert.are.equal(0, #proc.live_with_arg("31." .. tag))
      local m = read_file(marks) or ""
      local after_term = m:match("TERM\n(.*)$")
      assert.is_not_nil(after_term, "the member that ignores SIGTERM got none:\n" .. m)
      assert.matches("tick", after_term, 1, true) -- it ran on after SIGTERM, until SIGKILL
      assert.is_true(gone_everywhere("group:kill"))
    end)

    -- While exec waits for the rest of the group: a signal to redlock stops
    -- the group before the lock is free, as for the command; so does a lost
    -- lock (exit 75), and a SIGKILLed redlock's watcher.
    for _, case in ipairs {
      { what = "SIGTERM to redlock", rc = 143 },
      { what = "SIGQUIT to redlock", rc = 131 },
      { what = "a lost lock", rc = 75 },
      { what = "SIGKILL to redlock", rc = 137 },
    } do
      it(case.what .. " while exec waits for the command's group stops the group; exit " .. case.rc, function()
        local tag = ("%d%d"):format(wall_ms() % 100000, case.rc)
        local key = "group:stop:" .. case.rc
        local job = bg(("exec --ttl 2000 --grace 300 %s -- sh -c 'sleep 32.%s & echo $! > %s.pid; exit 0'")
          :format(key, tag, key), QUIT_DFL .. " " .. ENV)
        local sleeper
        assert.is_true(eventually(function()
          sleeper = tonumber(read_file(TMP .. "/" .. key .. ".pid") or "")
          return sleeper
        end), job.output())
        finally(function() proc.kill(sleeper, "KILL") end)
        sleep_ms(300)
        assert.is_nil(job:wait(0), "exec exited while the command's background sleep still ran")
        assert.is_true(proc.alive(sleeper))
        if case.rc == 143 then
          job:signal("TERM")
        elseif case.rc == 131 then
          job:signal("QUIT")
        elseif case.rc == 137 then
          job:signal("KILL")
        else
          for i = 1, 3 do cl:cli(i, "SET", key, "thief", "PX", "10000") end
        end
        local rc, out = job:wait(5000)
        assert.are.equal(case.rc, rc, out)
        if case.rc == 75 then
          assert.matches(("lock on '%s' lost; stopped what sh %%(pid %%d+, exited 0%%) left in its process group")
            :format(key:gsub("%p", "%%%0")), out)
          for i = 1, 3 do assert.are.equal("thief", get(i, key)) end
        end
        if case.rc == 137 then -- the watcher stops the group after redlock has died
          assert.is_true(proc.wait_gone(sleeper, 5000), "the group outlived a SIGKILLed redlock")
        else -- redlock stops the group before it releases and exits
          assert.is_false(proc.alive(sleeper), "the group outlived exec")
          if case.rc == 143 or case.rc == 131 then assert.is_true(gone_everywhere(key)) end
        end
      end)
    end

    -- Before: the host's signal self-pipe was not close-on-exec. Every command
    -- inherited it (fds 3 and 4 when redlock starts with only 0-2), and could
    -- fake a signal by writing a signal number into it; started with fds 0-2
    -- closed, the pipe took their place and became the command's stdin.
    local CLOSEFDS = ROOT .. "/spec/helpers/closefds.lua"

    --- `redlock ARGS` started with every fd from `first` on closed (ended after 60 s).
    local function redlock_closed(first, args, env)
      return sh(("cd %s && env %s timeout 60 luajit %s %d %s %s"):format(q(TMP), env or "", q(CLOSEFDS), first,
        q(BIN), args))
    end

    --- The fd numbers in a listing of /proc/PID/fd (`ls` or `ls -l`), sorted; and fd -> target.
    local function fds(listing)
      local list, target = {}, {}
      for line in listing:gmatch("[^\n]+") do
        local fd, to = line:match("(%d+) %-> (.+)$")
        fd = fd or line:match("^(%d+)$")
        if fd then
          list[#list + 1] = tonumber(fd)
          target[tonumber(fd)] = to
        end
      end
      table.sort(list)
      return list, target
    end

    it("a command, an os.execute or io.popen command inherits no file descriptor of redlock's, only 0-2", function()
      local out, rc = redlock_closed(3, "exec --ttl 5000 fds:exec -- sh -c 'ls -l /proc/$$/fd; exit 0'", ENV)
      assert.are.equal(0, rc, out)
      assert.are.same({ 0, 1, 2 }, (fds(out)), out)
      local name = script("fds.lua", [[
        local lock = assert(require("redlock").default():lock("fds:run", { ttl = 5000 }))
        os.execute('sh -c "ls -l /proc/\\$PPID/fd > fds.execute"; exit 0') -- lists the outer shell
        local p = io.popen("ls -l /proc/$$/fd; exit 0")
        local listing = p:read("*a")
        p:close()
        print(listing)
        assert(lock:unlock())
      ]])
      out, rc = redlock_closed(3, "run " .. name, ENV)
      assert.are.equal(0, rc, out)
      assert.are.same({ 0, 1, 2 }, (fds(out)), "io.popen:\n" .. out)
      local listing = read_file(TMP .. "/fds.execute") or ""
      assert.are.same({ 0, 1, 2 }, (fds(listing)), "os.execute:\n" .. listing)
    end)

    it("a command cannot fake a signal to redlock (printf to fd 4 exits 0, survived)", function()
      local out, rc = redlock_closed(3,
        [[exec -v --ttl 2000 fds:fake -- sh -c 'printf "\017" >&4; sleep 3; echo survived']], ENV)
      assert.are.equal(0, rc, out)
      assert.matches("survived", out, 1, true)
      assert.is_true(gone_everywhere("fds:fake"))
    end)

    it("started with fds 0-2 closed, gives the command /dev/null as 0-2 and nothing else", function()
      -- the listing is the command's, a shell without redirections of its own (an inner shell lists it)
      -- the listing is of the command: a shell with no redirection of its own (an inner one lists it)
      local out, rc = redlock_closed(0, "exec --ttl 5000 fds:closed -- sh -c "
        .. q([[sh -c "ls -l /proc/\$PPID/fd > closed.fds"; if read x; then echo read; else echo eof; fi > closed.stdin; exit 5]]),
        ENV)
      assert.are.equal(5, rc, out)
      local listing = read_file(TMP .. "/closed.fds") or ""
      local list, target = fds(listing)
      assert.are.same({ 0, 1, 2 }, list, listing)
      for fd = 0, 2 do assert.are.equal("/dev/null", target[fd], listing) end
      assert.are.equal("eof\n", read_file(TMP .. "/closed.stdin"))
      assert.is_true(gone_everywhere("fds:closed"))
    end)

    -- Ctrl-Z on a terminal stops only the command's process group (the
    -- terminal's foreground): redlock stops with it, so the shell gets its
    -- job back (checked by hand in a terminal: a spec has no job-control
    -- shell). Any other stop is the command's alone.
    local function state(pid)
      local stat = read_file("/proc/" .. pid .. "/stat")
      return stat and stat:match("^%d+ %b() (%a)")
    end

    -- Before: exec stopped itself with SIGSTOP for any stop of its command;
    -- a debugger or a CPU limiter that continued only the command left the
    -- host stopped and the lock unextended: it ran out under the command, and
    -- a second holder got it while the command still ran.
    it("keeps the lock while its command is stopped by another process, and never stops itself", function()
      local go = TMP .. "/stopped.go"
      local job = bg(("exec --ttl 1000 stopped:r -- sh -c 'echo $$ > stopped.pid; "
        .. "while [ ! -e %s ]; do sleep 0.05; done; echo finished'"):format(go), ENV)
      local child
      assert.is_true(eventually(function()
        child = tonumber(read_file(TMP .. "/stopped.pid") or "")
        return child
      end), job.output())
      finally(function() -- whatever happened, nothing stays stopped or running
        proc.kill(job.pid, "CONT")
        proc.kill(-child, "CONT")
        if job:wait(0) == nil then proc.kill(job.pid, "KILL") end
      end)
      assert.is_true(proc.kill(-child, "STOP"))
      -- stopped: no member runs or sleeps. (The shell may be stuck in D: a
      -- dash that vforked its sleep waits uninterruptibly for a child stopped
      -- before its exec.)
      local function group_states()
        local states = {}
        for _, pid in ipairs(proc.live_in_group(child)) do states[#states + 1] = tostring(state(pid)) end
        return table.concat(states, " ")
      end
      assert.is_true(eventually(function()
        local states = group_states()
        return states:find("T", 1, true) and not states:find("[RS]")
      end), ("group %d: states %s; %s"):format(child, group_states(), job.output()))
      sleep_ms(1500) -- past the whole ttl: only keep-alive can hold it now
      assert.are_not.equal("T", state(job.pid), "redlock stopped with its command")
      local _, rc = redlock("exec -n stopped:r -- true", ENV)
      assert.are.equal(1, rc, "a second holder got the lock while the command was stopped")
      assert.is_true(proc.kill(-child, "CONT"))
      write_file(go, "")
      local code, out = job:wait(10000)
      assert.are.equal(0, code, out)
      assert.matches("finished", out, 1, true)
      assert.is_true(gone_everywhere("stopped:r"))
    end)

    it("ignores SIGTSTP sent to it while the command runs: stopped alone, it would let the lock run out", function()
      local started = TMP .. "/tstp.started"
      local job = bg(("exec --ttl 600 tstp:r -- sh -c 'touch %s; sleep 2; echo finished'"):format(q(started)), ENV)
      -- the command runs: redlock supervises it (before, it may still be acquiring)
      assert.is_true(eventually(function() return read_file(started) ~= nil end), job.output())
      finally(function()
        proc.kill(job.pid, "CONT")
        if job:wait(0) == nil then proc.kill(job.pid, "KILL") end
      end)
      assert.is_true(proc.kill(job.pid, 20)) -- SIGTSTP
      sleep_ms(1200) -- two ttls: a stopped redlock would have let the lock run out by now
      assert.are_not.equal("T", state(job.pid), "redlock stopped on SIGTSTP")
      local _, rc = redlock("exec -n tstp:r -- true", ENV)
      assert.are.equal(1, rc, "a second holder got the lock")
      local code, out = job:wait(10000)
      assert.are.equal(0, code, out)
      assert.matches("finished", out, 1, true)
    end)

    it("stopped itself (SIGSTOP) past its validity, then continued: SIGKILLs the command at once; exit 75", function()
      local marks = TMP .. "/late.marks"
      local child = marking_script("late.sh", marks, 1000)
      local job = bg(("exec --ttl 1000 late:r -- sh %s"):format(child), ENV)
      assert.is_true(eventually(function() return (read_file(marks) or ""):find("start") end), job.output())
      assert.is_true(job:signal("STOP"))
      sleep_ms(1500) -- past the ttl: nothing extends the lock meanwhile
      assert.is_true(job:signal("CONT"))
      local rc, out = job:wait(10000)
      assert.are.equal(75, rc, out)
      assert.matches("lock on 'late:r' lost; stopped sh %(pid %d+%): SIGKILL %(no validity left%)", out)
      -- (a SIGTERM would let the command's handler run while another may hold the lock)
      local seen = read_file(marks) or ""
      assert.is_nil(seen:find("TERM"), seen)
      assert.is_nil(seen:find("end"), seen)
    end)

    -- Before: the group had ended while redlock was stopped, and redlock,
    -- continued, released and exited with the command's status 0, though
    -- another had taken the lock while the command still ran.
    it("stopped itself past its validity while the command ended: exit 75, not the command's status", function()
      local started = TMP .. "/ended.started"
      local job = bg(("exec --ttl 1000 ended:r -- sh -c 'echo go > %s; sleep 0.5'"):format(q(started)), ENV)
      assert.is_true(eventually(function() return read_file(started) end), job.output())
      assert.is_true(job:signal("STOP"))
      sleep_ms(2000) -- the command ends, and the ttl runs out, while redlock is stopped
      assert.is_true(job:signal("CONT"))
      local rc, out = job:wait(10000)
      assert.are.equal(75, rc, out)
      assert.matches("lock on 'ended:r' lost before sh's process group ended", out, 1, true)
    end)

    it("passes no fencing token or slot of an outer exec to a command whose lock has none", function()
      local out, rc = redlock("exec plainenv:r -- env", "REDLOCK_TOKEN=999 REDLOCK_SLOT=5 " .. ENV)
      assert.are.equal(0, rc, out)
      assert.matches("REDLOCK_RESOURCE=plainenv:r", out, 1, true)
      assert.is_nil(out:find("REDLOCK_TOKEN=", 1, true), out)
      assert.is_nil(out:find("REDLOCK_SLOT=", 1, true), out)
    end)

    it("runs an executable file without a #! line with /bin/sh, as flock(1) does", function()
      script("noshebang.sh", "echo \"ran $1\"\nexit 4\n")
      os.execute(("chmod +x %s/noshebang.sh"):format(q(TMP)))
      local out, rc = redlock("exec noshebang:r -- ./noshebang.sh arg1", ENV)
      assert.are.equal(4, rc, out)
      assert.matches("ran arg1", out, 1, true)
      assert.is_true(gone_everywhere("noshebang:r"))
    end)

    it("gives the terminal to the command, so it can read it", function()
      if not sh("command -v script") :find("script") then
        pending("needs script(1) for a pseudo-terminal")
        return
      end
      local out, rc = sh(("cd %s && (sleep 0.5; echo typed) | env %s timeout 20 script -qec %s /dev/null")
        :format(q(TMP), ENV, q(q(BIN) .. [[ exec tty:r -- sh -c 'read x; echo "got $x"; exit 3']])))
      assert.are.equal(3, rc, out)
      assert.matches("got typed", out, 1, true)
    end)

    it("takes a retry policy from a Lua file", function()
      local out, rc = redlock("exec --policy " .. q(ROOT .. "/examples/jobs/backoff_policy.lua")
        .. " policy:r -- echo ran", ENV)
      assert.are.equal(0, rc, out)
      assert.matches("ran", out, 1, true)
      -- a policy that gives up at once
      local giveup = script("giveup.lua", "return function() return nil end\n")
      local holder = bg("exec policy:held -- sleep 2", ENV)
      assert.is_true(eventually(function() return get(1, "policy:held") ~= nil end))
      local took
      out, rc, took = redlock("exec --policy " .. giveup .. " policy:held -- echo ran", ENV)
      assert.are.equal(1, rc, out)
      assert.is_true(took < 500)
      assert.are.equal(0, (holder:wait(5000)))
    end)

    it("says clearly what is wrong with a broken --policy file, exit 64", function()
      local broken = script("broken.lua", "return function(attempt\n")
      local out, rc = redlock("exec --policy " .. broken .. " policy:r -- echo ran", ENV)
      assert.are.equal(64, rc)
      assert.matches("^redlock: %-%-policy broken.lua: broken.lua:2: ", out)
      assert.is_nil(out:find("ran\n", 1, true))
      local notfn = script("notfn.lua", "return 42\n")
      out, rc = redlock("exec --policy " .. notfn .. " policy:r -- echo ran", ENV)
      assert.are.equal(64, rc)
      assert.matches("--policy notfn.lua must return a function", out, 1, true)
      -- before: the maker ran as the policy ("the policy failed: ... max must be ...")
      local maker = script("maker.lua", "return require('redlock').retry.forever\n")
      out, rc = redlock("exec --policy " .. maker .. " policy:r -- echo ran", ENV)
      assert.are.equal(64, rc, out)
      assert.matches("--policy maker.lua returned redlock.retry.forever, which makes a policy: return "
        .. "redlock.retry.forever(...)", out, 1, true)
      local raises = script("raises.lua", "error('no policy for you')\n")
      out, rc = redlock("exec --policy " .. raises .. " policy:r -- echo ran", ENV)
      assert.are.equal(64, rc)
      assert.matches("no policy for you", out, 1, true)
      out, rc = redlock("exec --policy missing.lua policy:r -- echo ran", ENV)
      assert.are.equal(64, rc)
      assert.matches("cannot open missing.lua", out, 1, true)
    end)
  end)

  describe("status", function()
    it("shows each node's holder and pttl, and whether a quorum holds it", function()
      local job = bg("exec status:r -- sh -c 'echo $REDLOCK_VALUE > status.value; sleep 1'", ENV)
      assert.is_true(eventually(function() return (read_file(TMP .. "/status.value") or ""):match("%S+") end))
      local value = read_file(TMP .. "/status.value"):match("%S+")
      cl:cli(5, "DEL", "status:r")
      local out, rc = redlock("status status:r", ENV)
      assert.are.equal(0, rc, out)
      assert.matches("resource 'status:r' on 5 nodes, quorum 3", out, 1, true)
      for i = 1, 4 do
        assert.matches(("%%s%d  redis://127%%.0%%.0%%.1:%d%%s+held%%s+%s%%.%%.%%.%%s+pttl %%d+ ms")
          :format(i, cl.ports[i], (value:sub(1, 12):gsub("%p", "%%%0"))), out)
      end
      assert.matches(("5  redis://127.0.0.1:%d  free"):format(cl.ports[5]), out, 1, true)
      assert.matches("held: value " .. value:sub(1, 12) .. "... on 4 of 5 nodes (quorum 3)", out, 1, true)
      assert.are.equal(0, (job:wait(5000)))
      out, rc = redlock("status status:r", ENV)
      assert.are.equal(1, rc, out)
      assert.matches("free: no node holds 'status:r'", out, 1, true)
    end)

    --- True if out has node idx's row: name, state, then text starting with info.
    local function has_row(out, idx, name, state, info)
      local esc = function(s) return (s:gsub("%p", "%%%0")) end
      return out:find(("\n%%s*%d  %s%%s+%s%%s+%s"):format(idx, esc(name), state, esc(info))) ~= nil
    end

    it("selects the URL's database and reports a refused AUTH as that node's error", function()
      local port = cl.ports[1]
      local db3 = ("redis://127.0.0.1:%d/3"):format(port)
      assert.are.equal("OK", (cl:cli(1, "-n", "3", "SET", "status:db", "in-db-3", "PX", "60000")))
      local out, rc = redlock("status --servers " .. db3 .. " status:db", "")
      assert.are.equal(0, rc, out)
      assert.is_true(has_row(out, 1, db3, "held", "in-db-3"), out)
      assert.matches("held: value in-db-3... on 1 of 1 nodes (quorum 1)", out, 1, true)
      out, rc = redlock(("status --servers redis://127.0.0.1:%d status:db"):format(port), "")
      assert.are.equal(1, rc, out)
      out, rc = redlock(("status --servers redis://:wrong@127.0.0.1:%d status:db"):format(port), "")
      assert.are.equal(69, rc, out)
      assert.is_true(has_row(out, 1, "redis://127.0.0.1:" .. port, "error", "AUTH: "), out)
      assert.is_nil(out:find("wrong", 1, true), "the password is shown")
      cl:cli(1, "-n", "3", "DEL", "status:db")
    end)

    it("a bad URL is a usage error (64)", function()
      local out, rc = redlock("status --servers " .. cl.urls[1] .. ",http://x status:r", "")
      assert.are.equal(64, rc, out)
      assert.matches("'http://x': unknown scheme", out, 1, true)
    end)

    -- The proxy holds every reply 400 ms: SELECT, then GET and PTTL, take two
    -- such round trips, 800 ms at the least, past the 500 ms a node is given
    -- in all (each wait alone is shorter).
    it("gives each node 500 ms in all, not 500 ms per reply", function()
      local px = faults.proxy(cl.ports[1], "delay 400")
      finally(function() px:stop() end)
      local out, rc = redlock("status --servers " .. px.url .. "/1 status:slow", "")
      assert.are.equal(69, rc, out)
      assert.matches("no answer within 500 ms", out, 1, true)
    end)

    it("a server named twice is a usage error (64): it would count twice toward the quorum", function()
      cl:cli(1, "SET", "status:twice", "someone", "PX", "30000")
      finally(function() cl:cli(1, "DEL", "status:twice") end)
      local servers = table.concat({ cl.urls[1], cl.urls[1], cl.urls[2] }, ",")
      local out, rc = redlock("status --servers " .. servers .. " status:twice", "")
      assert.are.equal(64, rc, out)
      assert.matches("servers 1 and 2 are the same server", out, 1, true)
      assert.is_nil(out:find("held:", 1, true), out)
    end)

    -- name: the node as status shows it (the URL without its password)
    for _, case in ipairs {
      { mode = "ok", url = "redis://127.0.0.1:%d", says = "GET: unexpected status reply 'OK'" },
      { mode = "ok", url = "redis://user:pw@127.0.0.1:%d/2", name = "redis://user@127.0.0.1:%d/2",
        says = "GET: unexpected status reply 'OK'" },
      { mode = "error", url = "redis://127.0.0.1:%d", says = "GET: ERR boom" },
      { mode = "error", url = "redis://:pw@127.0.0.1:%d", name = "redis://127.0.0.1:%d", says = "AUTH: ERR boom" },
      { mode = "readonly", url = "redis://127.0.0.1:%d/1", says = "SELECT: READONLY" },
      { mode = "garbage", url = "redis://127.0.0.1:%d", says = "GET: " },
      { mode = "reset", url = "redis://127.0.0.1:%d", says = "" },
      { mode = "silent", url = "redis://127.0.0.1:%d", says = "GET: no answer within 500 ms" },
    } do
      it(("a node in fake mode '%s' (%s) is an error row and exit 69, not a crash")
        :format(case.mode, (case.url:gsub("%%d", "PORT"))),
        function()
          local fake = faults.fakeserver(case.mode)
          local out, rc = redlock("status --servers " .. case.url:format(fake.port) .. " status:fake", "")
          fake:stop()
          assert.are.equal(69, rc, out)
          assert.is_true(has_row(out, 1, (case.name or case.url):format(fake.port), "error", case.says), out)
          assert.matches("unknown: only 0 of 1 nodes answered (quorum 1)", out, 1, true)
          assert.is_nil(out:find("traceback", 1, true), out)
        end)
    end

    it("a node that answers +OK to everything does not count; the others decide (exit 1 or 0)", function()
      local fake = faults.fakeserver("ok")
      local servers = table.concat({ cl.urls[1], cl.urls[2], fake.url }, ",")
      local out, rc = redlock("status --servers " .. servers .. " status:ok", "")
      assert.are.equal(1, rc, out)
      assert.is_true(has_row(out, 3, fake.url, "error", "GET: unexpected status reply 'OK'"), out)
      assert.matches("free: no node holds 'status:ok'", out, 1, true)
      for i = 1, 2 do cl:cli(i, "SET", "status:ok", "the-holder", "PX", "60000") end
      out, rc = redlock("status --servers " .. servers .. " status:ok", "")
      fake:stop()
      for i = 1, 2 do cl:cli(i, "DEL", "status:ok") end
      assert.are.equal(0, rc, out)
      assert.matches("held: value the-holder... on 2 of 3 nodes (quorum 2)", out, 1, true)
    end)

    it("no Lua module mirrors hiredis' structs or binds hiredis' functions", function()
      local out = sh("grep -rnE 'redisReply|redisContext|redisReader|asm *\\( *\"(redis|freeReplyObject)' "
        .. q(ROOT .. "/lua"))
      assert.are.equal("", out)
    end)

    it("sys.lua declares rl_host_probe_result as core/host/host.h lays it out", function()
      local ffi = require "ffi"
      local sys = require "redlock.host.sys"
      local T = "rl_host_probe_result"
      local fields = { "err", "errstr", "name", "exists", "pttl", "value_len", "value_digest", "value", "has_fence",
        "fence_len", "fence_token", "fence", "readers", "run_id" }
      local dir = proc.tmpdir()
      local lines = { "#include <stdio.h>", "#include <stddef.h>", '#include "host.h"', "int main(void) {",
        ('printf("sizeof %%zu\\n", sizeof(%s));'):format(T),
        'printf("EINVAL %d\\nENODE %d\\n", RL_HOST_PROBE_EINVAL, RL_HOST_PROBE_ENODE);' }
      local expect = { sizeof = ffi.sizeof(T), EINVAL = sys.PROBE_EINVAL, ENODE = sys.PROBE_ENODE }
      for _, f in ipairs(fields) do
        lines[#lines + 1] = ('printf("%s %%zu\\n", offsetof(%s, %s));'):format(f, T, f)
        expect[f] = ffi.offsetof(T, f)
      end
      lines[#lines + 1] = "return 0; }"
      write_file(dir .. "/layout.c", table.concat(lines, "\n") .. "\n")
      local out, rc = sh(("%s -std=c11 -I%s $(pkg-config --cflags luajit) -o %s %s && %s"):format(
        os.getenv("CC") or "cc", q(ROOT .. "/core/host"), q(dir .. "/layout"), q(dir .. "/layout.c"),
        q(dir .. "/layout")))
      proc.rmdir(dir)
      assert.are.equal(0, rc, out)
      local got = {}
      for k, v in out:gmatch("([%w_]+) (%d+)") do got[k] = tonumber(v) end
      assert.are.same(expect, got)
    end)
  end)

  describe("dev", function()
    it("starts N nodes, prints the REDLOCK_SERVERS line, stops them all on Ctrl-C", function()
      local job = bg("dev 3", "")
      assert.is_true(eventually(function() return job.output():find("Ctrl%-C stops them") end, 10000),
        job.output())
      local out = job.output()
      local line = out:match("export REDLOCK_SERVERS=(%S+)")
      assert.is_not_nil(line, out)
      local pids = {}
      for pid in out:match("%(pids ([%d ]+)%)"):gmatch("%d+") do pids[#pids + 1] = tonumber(pid) end
      assert.are.equal(3, #pids)
      local status_out, rc = redlock("status dev:r", "REDLOCK_SERVERS=" .. line)
      assert.are.equal(1, rc, status_out)
      assert.matches("free: no node holds", status_out, 1, true)
      job:signal("INT")
      assert.are.equal(0, (job:wait(10000)))
      for _, pid in ipairs(pids) do
        assert.is_true(eventually(function()
          local stat = read_file("/proc/" .. pid .. "/stat")
          return not stat or stat:match("^%d+ %b() (%a)") == "Z"
        end, 3000), "redis-server " .. pid .. " still running")
      end
    end)
  end)

  describe("demo", function()
    it("runs end to end with no configuration and leaves no redis-server behind", function()
      local out, rc = redlock("demo --workers 3 --rounds 3", "-u REDLOCK_SERVERS")
      assert.are.equal(0, rc, out)
      assert.matches("overlaps: 0   lost updates: 0", out, 1, true)
      assert.matches("9 critical sections", out, 1, true)
      assert.matches("OK: one holder at a time", out, 1, true)
      local pids = out:match("%(pids ([%d ]+)%)")
      assert.is_not_nil(pids, out)
      for pid in pids:gmatch("%d+") do
        local stat = read_file("/proc/" .. pid .. "/stat")
        assert.is_true(not stat or stat:match("^%d+ %b() (%a)") == "Z", "redis-server " .. pid .. " left behind")
      end
    end)
  end)

  -- Before: demo took only --servers of the server options ("unknown option
  -- --servers-file", 64), and a bad or doubled URL was a worker's traceback
  -- and FAILED (exit 1).
  describe("demo on configured servers", function()
    it("takes the server options the other commands take, and its workers use them", function()
      write_file(TMP .. "/demo.servers", "# the nodes\n" .. table.concat(cl.urls, "\n") .. "\n")
      local out, rc = redlock("demo --servers-file demo.servers --prefix demo: --label demo-l --insecure"
        .. " --workers 2 --rounds 2", "-u REDLOCK_SERVERS")
      assert.are.equal(0, rc, out)
      assert.matches("using the 5 configured nodes", out, 1, true)
      assert.matches("OK: one holder at a time", out, 1, true)
      -- the votes are read under the prefixed key: every node granted some
      local votes = assert(out:match("votes for the granted locks: ([^\n]*)"), out)
      assert.is_nil(votes:find(": 0 ok", 1, true), out)
      local _, warnings = out:gsub("TLS certificate verification is off", "")
      assert.are.equal(1, warnings, out)
      assert.is_nil(out:find("traceback", 1, true), out)
    end)

    it("a bad or doubled server URL, or a bad --label, is a usage error (64), before any worker", function()
      for _, case in ipairs {
        { "--servers bogus://x", "server 1: 'bogus://x': unknown scheme" },
        { "--servers " .. cl.urls[1] .. "," .. cl.urls[1], "one server would vote twice" },
        { "--servers " .. cl.urls[1] .. " --label 'a b'", "--label must be" },
        { "--servers " .. cl.urls[1] .. " --prefix redlock:", [[--prefix 'redlock:' starts with "redlock:"]] },
        -- (before: 17 nodes started, and every worker died on "too many servers")
        { "--nodes 17", "--nodes must be from 1 to 16, got 17" },
      } do
        local out, rc = redlock("demo --workers 1 --rounds 1 " .. case[1], "-u REDLOCK_SERVERS")
        assert.are.equal(64, rc, case[1] .. ": " .. out)
        assert.matches(case[2], out, 1, true)
        assert.is_nil(out:find("FAILED", 1, true), out)
        assert.is_nil(out:find("traceback", 1, true), out)
      end
    end)
  end)

  describe("C files", function()
    -- What each object of the executable defines and what it takes from the others.
    local function host_objects()
      local build = BIN:match("^(.*)/[^/]+$")
      local objs = {}
      local p = io.popen(("find %s -path '*/core/host/CMakeFiles/redlock.dir/*' -name '*.c.o' | sort"):format(q(build)))
      for path in p:lines() do objs[#objs + 1] = { path = path, name = path:match("([^/]+)%.c%.o$") } end
      p:close()
      assert.is_true(#objs >= 4, "no objects of the host under " .. build)
      for _, o in ipairs(objs) do
        o.defines, o.uses = {}, {}
        local out, rc = sh("nm -g --defined-only " .. q(o.path))
        assert.are.equal(0, rc, out)
        for sym in out:gmatch("%x+ [A-Z] ([%w_]+)") do o.defines[sym] = true end
        out, rc = sh("nm -u " .. q(o.path))
        assert.are.equal(0, rc, out)
        for sym in out:gmatch("U ([%w_]+)") do o.uses[sym] = true end
      end
      return objs
    end

    it("depend on each other one way only", function()
      local objs = host_objects()
      local function needs(a, b)
        for sym in pairs(a.uses) do
          if b.defines[sym] then return sym end
        end
      end
      local cycles = {}
      for i, a in ipairs(objs) do
        for j = i + 1, #objs do
          local b = objs[j]
          local ab, ba = needs(a, b), needs(b, a)
          if ab and ba then
            cycles[#cycles + 1] = ("%s.c uses %s of %s.c, which uses %s of %s.c")
              :format(a.name, ab, b.name, ba, a.name)
          end
        end
      end
      assert.are.same({}, cycles)
    end)
  end)

  describe("installed with cmake --install", function()
    it("finds its modules from any directory, with no LUA_PATH", function()
      local build = BIN:match("^(.*)/[^/]+$")
      local prefix = TMP .. "/prefix"
      local out, rc = sh(("cmake --install %s --prefix %s"):format(q(build), q(prefix)))
      assert.are.equal(0, rc, out)
      local installed = prefix .. "/bin/redlock"
      local name = script("where.lua", [[
        local redlock = require "redlock"
        print(package.searchpath("redlock", package.path))
        local lock = assert(redlock.default():lock("install:r", { ttl = 2000 }))
        assert(lock:unlock())
        print("locked and released")
      ]])
      out, rc = sh(("cd / && env -u LUA_PATH -u LUA_CPATH %s %s run %s"):format(ENV, q(installed),
        q(TMP .. "/" .. name)))
      assert.are.equal(0, rc, out)
      assert.matches(prefix .. "/bin/../share/lua/5.1/redlock/init.lua", out, 1, true)
      assert.matches("locked and released", out, 1, true)
      out, rc = sh(("cd / && env -u LUA_PATH -u LUA_CPATH %s --version"):format(q(installed)))
      assert.are.equal(0, rc, out)
    end)
  end)
end)
