--- The `redlock` host executable's Lua side: subcommand dispatch, help,
-- messages and exit statuses. core/host/main.c calls main(arg) and exits with
-- what it returns.

local _M = {}

--- Exit statuses every subcommand shares (documented in `redlock --help`).
_M.EXIT = {
    OK = 0,
    FAIL = 1,          -- script error; exec's default conflict status; status: not held
    USAGE = 64,        -- bad option or argument, no servers configured, bad --policy file
    UNAVAILABLE = 69,  -- too few nodes answered to decide
    LOST = 75,         -- exec: the lock was lost while the command ran (it was stopped)
    NOEXEC = 126,      -- exec: the command cannot be executed
    NOTFOUND = 127,    -- exec: the command was not found
}

_M.COMMANDS = { "run", "exec", "status", "dev", "demo" }

local function self_info()
    return package.loaded["redlock.host.self"] or {}
end

-- A URL cut short before its '@' (a password with a comma, a space or a '#'
-- in it, split there): scheme://[user]:rest up to the end of the fragment.
-- rest is kept only when it is a port (host:port[/db], [v6]:port, a port
-- that ends a sentence or a label: "...:6379:", the word "port" of the
-- usage messages, also as a cluster's "host:port+host:port", and a port
-- followed by ; or | and another URL: a list split at the wrong character,
-- which the message must show).
local function redact_cut(scheme, user, rest)
    if rest:sub(1, 3) == "***" then return nil end
    if user ~= "" and (user:sub(1, 1) == "[" or rest:match("^port$") or rest:match("^port[+)]")
            or rest:match("^%d+[:.;]?$") or rest:match("^%d+[/?)%]+]")
            or rest:match("^%d+[;|]%a[%w+.-]*://")) then -- (host:port, then a list split at the wrong character)
        return nil
    end
    return scheme .. user .. ":***"
end

-- What ends a URL's user part, and what ends its password.
local USER_END, PASSWORD_END = "[:/@%s'\",]", "[@%s'\",]"

-- One pass of redact over text: whole (true), scheme://user:secret@ ->
-- scheme://user:***@; else a URL cut before its '@' (redact_cut). As
-- text:gsub with the patterns "(%a[%w+.-]*://[^:/@%s'\",]*:)[^@%s'\",]*@"
-- and "(%a[%w+.-]*://)([^:/@%s'\",]*):([^@%s'\",]*)" would, in linear time:
-- gsub tries such a pattern at every byte, and each try at a letter runs
-- to the end of its run of letters, so a 30 kB resource name in a message
-- took seconds (spec/host_redact_spec.lua compares the two forms).
local function redact_pass(text, whole)
    local out, done, search = {}, 1, 1
    local stop_from, stop_at = 1, 0 -- no PASSWORD_END in [stop_from, stop_at), one at stop_at
    local function password_end(x)
        if x < stop_from or x > stop_at then stop_from, stop_at = x, text:find(PASSWORD_END, x) or #text + 1 end
        return stop_at
    end
    while true do
        local s = text:find("://", search, true)
        if not s then break end
        search = s + 3
        -- the scheme: the run of [%w+.-] before "://", from its first letter
        local b = s
        while b > done and text:find("^[%w+.-]", b - 1) do b = b - 1 end
        b = text:find("%a", b)
        local user_end = text:find(USER_END, s + 3) or #text + 1
        if b and b < s and text:byte(user_end) == 58 then -- ':'
            local e = password_end(user_end + 1)
            local repl
            if whole then
                if text:byte(e) == 64 then repl = text:sub(b, user_end) .. "***@" end -- '@'
            else
                repl = redact_cut(text:sub(b, s + 2), text:sub(s + 3, user_end - 1), text:sub(user_end + 1, e - 1))
                e = e - 1
            end
            if repl then
                out[#out + 1] = text:sub(done, b - 1)
                out[#out + 1] = repl
                done = e + 1
            end
            if repl or not whole then search = math.max(search, e + 1) end
        end
    end
    if done == 1 then return text end
    out[#out + 1] = text:sub(done)
    return table.concat(out)
end

--- text with the password of every URL in it replaced by ***
-- (scheme://user:secret@... -> scheme://user:***@...), also of a URL cut
-- before its '@' (scheme://user:secret -> scheme://user:***).
function _M.redact(text)
    if not text:find("://", 1, true) then return text end
    return redact_pass(redact_pass(text, true), false)
end

--- s with its control bytes written as \xNN: what nodes send (errors,
-- values, labels) must not drive the terminal. keep_lines: newlines and
-- tabs stay (a multi-line message, a traceback).
function _M.printable(s, keep_lines)
    local pattern = keep_lines and "[%z\1-\8\11-\31\127]" or "[%z\1-\31\127]"
    return (s:gsub(pattern, function(c) return ("\\x%02x"):format(c:byte()) end))
end

--- An error object as text: a string as it is, one whose __tostring gives
--- a string by that (a __tostring that raises or gives anything else does
--- not count), else what it is.
function _M.error_text(e)
    if type(e) == "string" then return e end
    local mt = getmetatable(e)
    local shown, text = false, nil
    if mt and mt.__tostring then shown, text = pcall(tostring, e) end
    return shown and type(text) == "string" and text or ("(error object is a %s value)"):format(type(e))
end

--- Print "redlock: message" on stderr, never with a password from a URL; return code.
function _M.fail(code, fmt, ...)
    local msg = select("#", ...) > 0 and fmt:format(...) or fmt
    io.stderr:write("redlock: ", _M.redact(msg), "\n")
    io.stderr:flush()
    return code
end

--- A usage error: the message, then where to look.
function _M.usage_error(cmd, msg)
    return _M.fail(_M.EXIT.USAGE, "%s\nTry 'redlock %s--help'.", msg, cmd and (cmd .. " ") or "")
end

local EXIT_STATUS_HELP = [[
Exit status:
  0        success (exec: the command's own status)
  1        exec: RESOURCE is held elsewhere (see -E); run: the script failed;
           status: not held by a quorum
  64       usage: bad option or argument, no servers, unusable --policy file
  69       too few nodes answered to decide (unavailable)
  75       exec: the lock was lost while the command ran; it was stopped
  126/127  exec: the command cannot be executed / was not found
  128+N    killed by signal N; SIGINT, SIGTERM, SIGHUP and SIGQUIT to
           redlock (and SIGPIPE to a run script's output) release its locks
           first and exit 130, 143, 129, 131 (141)]]

local function usage()
    return ([[
Usage: redlock COMMAND [OPTIONS] [ARGS...]

Distributed locks (the Redlock algorithm) over N independent Redis nodes,
and a LuaJIT host for lock-protected work.

Commands:
  run SCRIPT.lua [ARGS...]             run a Lua job script; require "redlock" works
                                       and redlock.default() is a configured client
  exec [OPTIONS] RESOURCE [--] CMD...  run a command while holding RESOURCE, like
                                       flock(1) across machines
  status [RESOURCE]                    who holds RESOURCE, node by node (without
                                       RESOURCE: which nodes answer)
  dev [N]                              start N (5) throwaway redis-server nodes
  demo                                 watch workers contend for one lock

Servers (for run, exec, status, demo):
  --servers URL,URL,...   or the environment variable REDLOCK_SERVERS
  --servers-file FILE     one URL a line, # comments: keeps passwords out of argv
  URL:  redis://[[user]:password@]host:port[/db][?replicas=N], rediss://...
        for TLS (certificates verified against the system's CAs), or
        unix:///path/to.sock[?db=N][&replicas=N]
  TLS:  --cacert FILE, --cacertdir DIR, --cert FILE, --key FILE, --sni NAME
        and --insecure, or REDLOCK_CACERT, REDLOCK_CACERTDIR, REDLOCK_CERT,
        REDLOCK_KEY, REDLOCK_SNI, REDLOCK_INSECURE=1 (the flags win)
  No servers yet? 'redlock dev' starts some; 'redlock demo' needs none.

Times (exec --ttl, -w, --grace): a number with a unit, 500ms, 10s, 1.5s, 2m,
1h; a bare number is milliseconds.

'redlock COMMAND --help' shows a command's options; 'redlock --version'.

%s
]]):format(EXIT_STATUS_HELP)
end

_M.EXIT_STATUS_HELP = EXIT_STATUS_HELP

function _M.version()
    local s = self_info()
    return ("redlock %s (%s)"):format(s.version or "?", s.luajit or jit.version)
end

local function load_command(name)
    for _, c in ipairs(_M.COMMANDS) do
        if c == name then return require("redlock.host." .. name) end
    end
    if name == "demo-worker" then return require("redlock.host.demo").worker end
    return nil
end

--- Run the command line arg (arg[0] the executable as invoked, arg[1..] the
--- command line); return the exit status.
function _M.main(arg)
    local argv = { [0] = arg[0] } -- run gives the script the executable as arg[-k]
    for i = 1, #arg do argv[i] = arg[i] end
    local first = argv[1]
    if first == nil then
        io.stderr:write(usage())
        return _M.EXIT.USAGE
    end
    if first == "--help" or first == "-h" or first == "help" then
        if first == "help" and argv[2] then
            local cmd = load_command(argv[2])
            if not cmd then return _M.usage_error(nil, ("unknown command '%s'"):format(argv[2])) end
            io.stdout:write(cmd.help())
            return _M.EXIT.OK
        end
        io.stdout:write(usage())
        return _M.EXIT.OK
    end
    if first == "--version" or first == "-V" or first == "version" then
        io.stdout:write(_M.version(), "\n")
        return _M.EXIT.OK
    end
    local cmd = load_command(first)
    if not cmd then
        if first:sub(1, 1) == "-" then
            return _M.usage_error(nil, ("unknown option '%s' (options follow the command)"):format(first))
        end
        if first:match("%.lua$") then
            return _M.usage_error(nil, ("unknown command '%s' (did you mean 'redlock run %s'?)")
                :format(first, first))
        end
        return _M.usage_error(nil, ("unknown command '%s'"):format(first))
    end
    local opts, k, warnings = require("redlock.host.args").parse(argv, 2, cmd.SPEC)
    if not opts then
        return _M.usage_error(first, cmd.hint and cmd.hint(k) or k)
    end
    for _, w in ipairs(warnings) do _M.fail(nil, "warning: %s", w) end
    if opts.help then
        io.stdout:write(cmd.help())
        return _M.EXIT.OK
    end
    return cmd.run(opts, argv, k)
end

return _M
