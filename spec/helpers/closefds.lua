-- Spec helper: `luajit closefds.lua FIRST PROGRAM [ARGS...]` closes every file
-- descriptor from FIRST on (0: standard input, output and error too), then
-- execs PROGRAM (searched in PATH) with ARGS. PROGRAM starts with exactly the
-- descriptors below FIRST, whatever the test runner left open.

local ffi = require "ffi"
local C = ffi.C

ffi.cdef [[
  int rl_closefds_close(int fd) asm("close");
  long rl_closefds_sysconf(int name) asm("sysconf");
  int rl_closefds_execvp(const char *file, const char *const argv[]) asm("execvp");
]]

local SC_OPEN_MAX = 4

local first = tonumber(arg[1] or "")
local program = arg[2]
if not first or not program then
  io.stderr:write("usage: closefds.lua FIRST PROGRAM [ARGS...]\n")
  os.exit(64)
end

local argv = ffi.new("const char *[?]", #arg)
local keep = {} -- the strings argv points to
for i = 2, #arg do
  keep[i] = arg[i]
  argv[i - 2] = keep[i]
end
argv[#arg - 1] = nil

local max = tonumber(C.rl_closefds_sysconf(SC_OPEN_MAX))
if not max or max <= 0 or max > 65536 then max = 65536 end
for fd = first, max - 1 do C.rl_closefds_close(fd) end
C.rl_closefds_execvp(program, argv)
os.exit(127) -- not found or not executable (stderr may be closed: no message)
