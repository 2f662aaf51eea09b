--- redlock exec [OPTIONS] RESOURCE -- COMMAND [ARGS...]
--
-- flock(1) across machines: acquire RESOURCE, run COMMAND in a process group
-- of its own while the keeper (a C thread) keeps the lock extended, release
-- when it exits, exit with its status.
--
-- Losing the lock: the keeper is given margin = grace + safety, so it declares
-- the lock lost while at least grace + safety ms of validity are left. The
-- host polls every POLL_MS and then sends the group SIGTERM, and SIGKILL after
-- grace ms: everything is dead about `safety` ms before the validity ends.
--
-- grace + safety must fit in half the ttl: the keeper extends every ttl/3,
-- and a margin beyond ttl/2 would leave the extension too little time before
-- the lock counts as lost. Without --grace, the grace period is DEFAULT_GRACE
-- or, when that does not fit, the most that does (max_grace); the shortest
-- ttl is the one where that is 0.
--
-- COMMAND's end: what it left running in its process group (`cmd &`) is still
-- protected by the lock. By default the lock is kept, extended, until every
-- member of the group has ended (checked every GROUP_POLL_MS), as flock(1)'s
-- lock stays while a child holds its file open; with --kill-group the rest of
-- the group gets SIGTERM, then SIGKILL after the grace period, first. Either
-- way the lock is released only once the group is gone (a lost lock stops it
-- as above), and redlock exits with COMMAND's own status.

local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"
local sys = require "redlock.host.sys"

local EXIT = host.EXIT
local _M = {}

local POLL_MS = 10
local GROUP_POLL_MS = 50 -- how often to look whether COMMAND's group has ended
local DEFAULT_TTL = 10000
local DEFAULT_GRACE = 2000
local MIN_SAFETY = 20
local UNREACHABLE_FIRST_MS = 2000 -- a cluster that cannot be reached is reported after this
local UNREACHABLE_EVERY_MS = 10000 -- and again after each such period

--- The validity kept in hand after SIGKILL: ttl/20, at least MIN_SAFETY ms.
local function safety_for(ttl)
    return math.max(MIN_SAFETY, math.floor(ttl / 20))
end

--- The longest grace period that fits ttl (negative when none does).
local function max_grace(ttl)
    return math.floor(ttl / 2) - safety_for(ttl)
end

local MIN_TTL = 2 * MIN_SAFETY -- the shortest ttl with max_grace(ttl) >= 0
assert(max_grace(MIN_TTL) == 0 and max_grace(MIN_TTL - 1) < 0)

local SPEC = config.spec {
    { name = "ttl", long = "ttl", arg = "TIME", check = "ms", warn_bare = true,
        help = ("lock time-to-live, kept extended every ttl/3 (default %ds; bare number: ms)")
            :format(DEFAULT_TTL / 1000) },
    { name = "wait", short = "w", long = "wait", arg = "TIME", check = "ms0", warn_bare = true,
        help = "give up after waiting TIME for the lock (default: forever; bare number: ms)" },
    -- the same option under another name: the last of -w and --timeout given wins
    { name = "wait", long = "timeout", arg = "TIME", check = "ms0", warn_bare = true,
        help = "the same as --wait (flock's name for it; bare number: ms)" },
    { name = "nonblock", short = "n", long = "nonblock",
        help = "fail at once if RESOURCE is held elsewhere" },
    { name = "conflict", short = "E", long = "conflict-exit-code", arg = "N", check = "status",
        help = "exit status when RESOURCE stays held elsewhere (1)" },
    { name = "policy", long = "policy", arg = "FILE.lua",
        help = "retry policy: a Lua file returning function(attempt, last) -> delay_ms|nil" },
    { name = "grace", long = "grace", arg = "TIME", check = "ms0",
        help = ("lock lost, --kill-group: SIGTERM, then SIGKILL after TIME (default %ds,"
            .. " less for a short --ttl; bare number: ms)"):format(DEFAULT_GRACE / 1000) },
    { name = "kill_group", long = "kill-group",
        help = "when COMMAND exits, stop the rest of its process group instead of waiting for it" },
    { name = "fence", long = "fence",
        help = "take a fencing token with the lock, in COMMAND's environment as REDLOCK_TOKEN" },
    { name = "limit", long = "limit", arg = "L", check = "limit",
        help = "RESOURCE is a semaphore: run when fewer than L holders run anywhere (1 to 1024); REDLOCK_SLOT says which slot" },
    { name = "shared", short = "s", long = "shared",
        help = "take a shared hold (flock -s): held with other shared holders, never with an exclusive one" },
    { name = "quiet", short = "q", long = "quiet", help = "no message when RESOURCE is held elsewhere" },
    { name = "verbose", short = "v", long = "verbose", help = "say when the lock is acquired and released" },
}
_M.SPEC = SPEC

--- The shortest ttl that DEFAULT_GRACE fits.
local function full_grace_ttl()
    local ttl = MIN_TTL
    while max_grace(ttl) < DEFAULT_GRACE do ttl = ttl + 1 end
    return ttl
end

function _M.help()
    return ([[
Usage: redlock exec [OPTIONS] RESOURCE [--] COMMAND [ARGS...]

Acquire RESOURCE on a quorum of the servers, run COMMAND in a process group of
its own while the lock is kept extended, release it once that group has
exited, and exit with COMMAND's status. COMMAND is run as given, without a
shell: for a shell command line, give `sh -c 'CMD'` as COMMAND (where
flock(1) takes -c 'CMD'). With --shared (flock -s), the hold is shared:
other shared holders of RESOURCE run beside COMMAND, and an exclusive one
waits for all of them (a writer that waits keeps new shared holders out).
COMMAND's environment has REDLOCK_RESOURCE,
REDLOCK_VALUE (this holder's lock value), REDLOCK_VALIDITY_MS, REDLOCK_TTL_MS
(the ttl redlock extends it with: an adopter passes it as its ttl), and with
--fence REDLOCK_TOKEN: a fencing token greater than every token granted for
RESOURCE before (a decimal integer up to 2^63-1: compare it as one, not as
a double), for COMMAND to hand to the resource it writes.

When COMMAND exits, what it left running in its process group (`cmd &`) is
still protected: redlock keeps the lock, extended, until every process of the
group has exited, then releases it and exits with COMMAND's status. With
--kill-group, it sends the rest of the group SIGTERM and, after the grace
period, SIGKILL instead, then releases. A process that left the group (setsid,
setpgid: a daemon) is out of reach of both: the lock does not cover it. While
redlock waits for the group, the terminal is redlock's again: Ctrl-C, Ctrl-\
or any SIGINT/SIGTERM/SIGHUP/SIGQUIT stops the group before the lock is
released, and Ctrl-Z is ignored (stopping redlock alone would let the lock run
out under the group).

If the lock is lost while COMMAND or its group runs (its keys are taken over,
or too few nodes answer extensions), COMMAND's process group gets SIGTERM and,
after the grace period, SIGKILL - before the lock's validity runs out - and
redlock exits with 75. Without -n or -w, redlock waits for RESOURCE as long as
it takes; while too few nodes can be reached, it says so on stderr, node by
node, after %d s and then every %d s.

The lock is extended every ttl/3. SIGKILL comes a safety margin (ttl/20, at
least %d ms) before the validity ends, and grace + safety must fit in half
the ttl. Without --grace, the grace period is %d ms or, for a short --ttl,
the most that fits: ttl/2 - safety (--ttl 1s: %d ms; %d ms from --ttl %dms
on). The shortest --ttl is %d ms (grace 0). A --grace that does not fit is a
usage error.

Options:
%s

TIME is a number with a unit: 500ms, 10s, 1.5s, 2m, 1h. A bare number is
milliseconds (--ttl 10000 is 10s); a --ttl, -w or --timeout of 1 to 999
without a unit gets a warning, as it was most likely meant in seconds.

%s
]]):format(UNREACHABLE_FIRST_MS / 1000, UNREACHABLE_EVERY_MS / 1000,
        MIN_SAFETY, DEFAULT_GRACE, max_grace(1000), DEFAULT_GRACE, full_grace_ttl(), MIN_TTL,
        args.describe(SPEC), host.EXIT_STATUS_HELP)
end

local function shell_quote(text)
    if text:match("^[%w%%+,./:=@_-]+$") then return text end
    return "'" .. text:gsub("'", [['\'']]) .. "'"
end

-- flock(1) habits: `flock FILE -c CMD` runs CMD with a shell; exec takes
-- the command itself.
local SHELL_FLAGS = { ["-c"] = true, ["--command"] = true }
local SHELL_HINT = "exec takes the command itself, not -c: write `redlock exec RESOURCE -- sh -c 'CMD'`"

--- A usage message with the flock -c habit answered (for a parse error).
function _M.hint(msg)
    if msg == "unknown option -c" or msg == "unknown option --command" then
        return msg .. "; " .. SHELL_HINT
    end
    return msg
end

--- Load a --policy file: a Lua chunk that returns the policy function.
local function load_policy(path)
    local chunk, err = loadfile(path)
    if not chunk then return nil, ("--policy %s: %s"):format(path, err) end
    local ok, policy = pcall(chunk)
    if not ok then return nil, ("--policy %s: %s"):format(path, tostring(policy)) end
    local mt = type(policy) == "table" and getmetatable(policy)
    if type(policy) ~= "function" and not (mt and mt.__call) then
        return nil, ("--policy %s must return a function(attempt, last) -> delay_ms or nil, got %s")
            :format(path, type(policy))
    end
    local maker = require("redlock.retry")._makers[policy]
    if maker then
        return nil, ("--policy %s returned redlock.retry.%s, which makes a policy: return redlock.retry.%s(...)")
            :format(path, maker, maker)
    end
    return policy
end

--- Say something while the command runs, if stderr takes it at once
-- (sys.say_now): a stderr nobody reads must not hold up the supervision.
local function say_now(fmt, ...)
    sys.say_now("redlock: " .. host.redact(fmt:format(...)) .. "\n")
end

--- Stop the child's process group: SIGTERM, then SIGKILL after grace_ms
-- (at once, without SIGTERM or SIGCONT first, when grace_ms is 0). status:
-- the child's exit status if it has been reaped already. Return the child's
-- status (false if reaped elsewhere).
local function stop_child(pid, grace_ms, status)
    if grace_ms > 0 then
        sys.kill(pid, sys.SIGTERM, true)
        sys.kill(pid, sys.SIGCONT, true)
    end
    local deadline = sys.now_ms() + grace_ms
    local function reap()
        if status == nil then
            local what, code = sys.wait(pid, false)
            if what == "exited" then status = code elseif what == "gone" then status = false end
        end
    end
    while sys.now_ms() < deadline do
        reap()
        if status ~= nil and not sys.group_alive(pid) then return status end
        sys.sleep_ms(POLL_MS)
    end
    sys.kill(pid, sys.SIGKILL, true)
    while status == nil do
        local what, code = sys.wait(pid, true)
        status = what == "exited" and code or false
    end
    return status
end

function _M.run(opts, argv, k)
    local resource = argv[k]
    if resource == nil or resource == "" then
        return host.usage_error("exec", "missing RESOURCE")
    end
    k = k + 1
    if argv[k] == "--" then
        k = k + 1
    elseif type(argv[k]) == "string" and argv[k]:sub(1, 1) == "-" then
        -- an option after RESOURCE (`exec deploy -w 10s -- cmd`) would be taken
        -- for the command, and the lock taken without it
        for j = k + 1, #argv do
            if argv[j] == "--" then
                return host.usage_error("exec", ("options go before RESOURCE: redlock exec [OPTIONS] %s -- COMMAND"
                    .. " (%s came after it)"):format(shell_quote(resource), argv[k]))
            end
        end
    end
    local command = {}
    for j = k, #argv do command[#command + 1] = argv[j] end
    if #command == 0 then
        return host.usage_error("exec", "missing COMMAND (redlock exec RESOURCE -- COMMAND [ARGS...])")
    end
    if SHELL_FLAGS[command[1]] then
        local line = {}
        for j = 2, #command do line[#line + 1] = command[j] end
        if #line == 0 then return host.usage_error("exec", SHELL_HINT) end
        return host.usage_error("exec", ("exec takes the command itself, not %s: write `redlock exec %s -- sh -c %s`")
            :format(command[1], shell_quote(resource), shell_quote(table.concat(line, " "))))
    end

    local ttl = opts.ttl or DEFAULT_TTL
    if ttl < MIN_TTL then
        return host.usage_error("exec", ("--ttl %d ms is too short: exec needs at least %d ms"
            .. " (a safety margin of %d ms, kept within half the ttl)"):format(ttl, MIN_TTL, MIN_SAFETY))
    end
    local safety = safety_for(ttl)
    local grace = opts.grace or math.min(DEFAULT_GRACE, max_grace(ttl))
    if grace > max_grace(ttl) then
        return host.usage_error("exec", ("--grace %d ms is too long for --ttl %d ms: grace + %d ms of safety "
            .. "must fit in half the ttl (--grace %d at most)"):format(grace, ttl, safety, max_grace(ttl)))
    end
    local margin = grace + safety
    if opts.nonblock and opts.wait then
        return host.usage_error("exec", "-n and -w exclude each other")
    end
    if opts.shared and opts.fence then
        return host.usage_error("exec", "--shared and --fence exclude each other: a shared hold has no fencing token")
    end
    if opts.limit and opts.shared then
        return host.usage_error("exec", "--limit and --shared exclude each other: a semaphore's slots are exclusive holds")
    end
    if opts.limit and opts.fence then
        return host.usage_error("exec", "--limit and --fence exclude each other")
    end
    local policy
    if opts.policy then
        local err
        policy, err = load_policy(opts.policy)
        if not policy then return host.fail(EXIT.USAGE, "%s", err) end
    end
    -- A policy that raises is the user's file too: its error is told, as a
    -- usage error, once the library has given up the attempts.
    local POLICY_RAISED, policy_error = {}, nil
    if policy then
        local user_policy = policy
        policy = function(...)
            local ok, delay = pcall(user_policy, ...)
            if not ok then
                policy_error = delay
                error(POLICY_RAISED, 0)
            end
            return delay
        end
    end
    local conflict = opts.conflict or EXIT.FAIL

    local dlm, cerr = config.client(opts)
    if not dlm then return host.fail(EXIT.USAGE, "%s", cerr) end
    local reserved = require("redlock")._reserved(dlm, resource)
    if reserved then
        dlm:close()
        return host.usage_error("exec", ("RESOURCE '%s' is reserved: %s"):format(resource, reserved))
    end
    local max_key = require("redlock.cdefs").lib.RL_MAX_KEY_LEN
    if #resource + #(dlm.prefix or "") > max_key then
        dlm:close()
        return host.usage_error("exec", ("RESOURCE is %d bytes long, more than a key may be (%d bytes with the prefix)")
            :format(#resource, max_key))
    end
    -- a semaphore's acquire names every slot's key (docs/semaphore.md, "Large limits")
    local slot_keys = opts.limit and opts.limit * (#resource + #(dlm.prefix or "") + 24)
    local max_slot_keys = require("redlock.cdefs").lib.RL_MAX_SLOT_KEYS
    if slot_keys and slot_keys > max_slot_keys then
        dlm:close()
        return host.usage_error("exec", ("--limit %d with a RESOURCE of %d bytes names %d bytes of slot keys,"
            .. " more than an acquire may (%d): use a shorter RESOURCE or a lower --limit")
            :format(opts.limit, #resource, slot_keys, max_slot_keys))
    end

    -- Waiting for a lock held elsewhere is silent; failing to reach a quorum of
    -- the nodes is not: say so after UNREACHABLE_FIRST_MS, then every
    -- UNREACHABLE_EVERY_MS, node by node.
    local next_report = UNREACHABLE_FIRST_MS
    local function unreachable(err, detail, ms)
        if ms < next_report then return end
        next_report = ms + UNREACHABLE_EVERY_MS
        host.fail(EXIT.UNAVAILABLE, "cannot lock '%s' for %d s: %s; still trying%s", resource,
            math.floor(ms / 1000), tostring(err), detail and ("\n" .. config.describe_detail(detail)) or "")
    end
    local locked, lock, why, detail = pcall(config.lock, dlm, resource, {
        ttl = ttl, margin = margin, policy = policy,
        nonblock = opts.nonblock, wait = opts.wait, unreachable = unreachable, fence = opts.fence,
        limit = opts.limit, shared = opts.shared,
    })
    if not locked then
        if lock == POLICY_RAISED then
            return host.fail(EXIT.USAGE, "--policy %s: the policy failed: %s", opts.policy,
                host.error_text(policy_error))
        end
        -- a --policy that returned what is not a delay: the user's file, so a usage error
        local msg = tostring(lock)
        local bad = opts.policy and msg:match("(bad retry policy:.*)$")
        if not bad then error(lock, 0) end
        return host.fail(EXIT.USAGE, "--policy %s: %s", opts.policy, bad)
    end
    if not lock then
        if why == "busy" then
            if not opts.quiet then
                host.fail(conflict, "'%s' is held elsewhere%s", resource,
                    opts.nonblock and "" or " (gave up waiting)")
            end
            return conflict
        end
        return host.fail(EXIT.UNAVAILABLE, "cannot lock '%s': %s%s", resource, tostring(why),
            detail and ("\n" .. config.describe_detail(detail)) or "")
    end
    if opts.verbose then
        io.stderr:write(("redlock: locked '%s' (value %s, valid %d ms)\n")
            :format(resource, lock.value, math.floor(lock.validity or ttl)))
    end

    sys.setenv("REDLOCK_RESOURCE", resource)
    sys.setenv("REDLOCK_VALUE", lock.value)
    sys.setenv("REDLOCK_VALIDITY_MS", math.floor(lock.validity or ttl))
    sys.setenv("REDLOCK_TTL_MS", ttl) -- for an adopter: each extension sets the nodes' ttl for both holders
    -- an adopter's client forms the same key: the prefix in use, also one from --prefix (none: unset)
    sys.setenv("REDLOCK_PREFIX", dlm.prefix)
    -- (unset otherwise: COMMAND must not take an outer exec's token or slot for this lock's)
    sys.setenv("REDLOCK_TOKEN", lock.token and lock.token_string or nil)
    sys.setenv("REDLOCK_SLOT", lock.slot and tostring(lock.slot) or nil)
    local pid, serr, errno = sys.spawn(command,
        sys.NEWPGRP + sys.SUPERVISE + sys.FOREGROUND + sys.DIE_WITH_HOST + sys.WATCHDOG, grace)
    if not pid then
        config.release(lock)
        if errno == sys.ENOENT then
            return host.fail(EXIT.NOTFOUND, "%s: command not found", command[1])
        end
        return host.fail(EXIT.NOEXEC, "%s: %s", command[1], serr)
    end

    local status -- COMMAND's exit status, once it has exited
    local next_group_check = 0
    local function finish(code)
        sys.forget(pid)
        local released, release_err = config.release(lock)
        if not released and release_err == "not held" then
            -- COMMAND, or a process it handed the lock to (dlm:adopt with
            -- REDLOCK_VALUE), released it before the group ended
            host.fail(code, "'%s' was no longer held when %s's process group ended (released by a process it"
                .. " was handed to, expired, or dropped by nodes that restarted); exiting with %s's status %d",
                resource, command[1], command[1], code)
        elseif opts.verbose then
            io.stderr:write(("redlock: released '%s'\n"):format(resource))
        end
        return code
    end
    while true do
        if status == nil then
            local what, code = sys.wait(pid, false, true)
            if what == "stopped" then
                -- Ctrl-Z on a terminal: stop with the command, so that the shell gets
                -- its job back; once continued, continue the command unless the lock
                -- was lost meanwhile (then it is stopped below, SIGCONT included). Any
                -- other stop is the command's: its lock is kept meanwhile.
                if sys.stop_self(pid, code) and not (config.lost(lock) or config.remaining(lock) <= grace + POLL_MS) then
                    sys.kill(pid, sys.SIGCONT, true)
                end
            elseif what == "exited" then
                status = code
                if sys.group_alive(pid) then
                    if opts.kill_group then
                        stop_child(pid, grace, status)
                        if opts.verbose then
                            say_now("%s exited (%d); stopped the rest of its process group %d: SIGTERM, SIGKILL"
                                .. " after %d ms", command[1], code, pid, grace)
                        end
                    elseif opts.verbose then
                        say_now("%s exited (%d); keeping '%s' until the rest of its process group %d has exited",
                            command[1], code, resource, pid)
                    end
                end
            elseif what == "gone" then
                -- reaped by the signal thread: it is ending the process
                config.release(lock)
                return EXIT.FAIL
            end
        end
        if status ~= nil and sys.now_ms() >= next_group_check then
            if not sys.group_alive(pid) then
                if config.lost(lock) or config.remaining(lock) <= 0 then
                    -- the group ended when nothing could vouch for the lock any more
                    -- (redlock was stopped past the validity, say): not a clean end
                    sys.forget(pid)
                    config.release(lock)
                    return host.fail(EXIT.LOST, "lock on '%s' lost before %s's process group ended (it exited %d"
                        .. " with no validity left, or the lock found gone); exiting %d", resource, command[1],
                        status, EXIT.LOST)
                end
                return finish(status)
            end
            next_group_check = sys.now_ms() + GROUP_POLL_MS
        end
        if config.lost(lock) or config.remaining(lock) <= grace + POLL_MS then
            -- the grace period ends `safety` ms before the validity, if at all:
            -- after a stop (Ctrl-Z, continued too late) none may be left, and
            -- then SIGKILL comes at once (no SIGCONT first)
            local g = math.max(0, math.min(grace, math.floor(config.remaining(lock)) - safety))
            local how = g > 0 and ("SIGTERM, SIGKILL after %d ms"):format(g) or "SIGKILL (no validity left)"
            -- the command is stopped first, and said so after: a write to a
            -- stderr nobody reads (a full pipe) would block, the command
            -- running on while another holder takes the lock
            stop_child(pid, g, status)
            sys.forget(pid)
            config.release(lock)
            if status == nil then
                return host.fail(EXIT.LOST, "lock on '%s' lost; stopped %s (pid %d): %s", resource, command[1], pid,
                    how)
            end
            return host.fail(EXIT.LOST, "lock on '%s' lost; stopped what %s (pid %d, exited %d) left in its"
                .. " process group: %s", resource, command[1], pid, status, how)
        end
        config.sleep(dlm, POLL_MS)
    end
end

return _M
