-- luacheck (Debian: lua-check) over the Lua in the tree; scripts/test runs
--   luacheck lua spec examples bench/*.lua
-- and it must report nothing.

std = "luajit"

-- The tree is written to about 120 columns; a few lines go a little past.
max_line_length = 130

-- The module runs inside nginx too, where ngx is a global (OpenResty's).
files["lua/redlock/backend.lua"] = { read_globals = { "ngx" } }
files["lua/redlock/cosocket.lua"] = { read_globals = { "ngx" } }
files["lua/redlock/nginx/*.lua"] = { read_globals = { "ngx" } }

-- Specs run under busted (luacheck gives *_spec.lua files its std already);
-- their helpers are plain LuaJIT.
files["spec/**/*_spec.lua"] = { std = "+busted" }
-- (and so do the sanitizer specs, run by name: spec/sanitizers/*_asan.lua)
files["spec/sanitizers/*_asan.lua"] = { std = "+busted" }

-- The benchmark summary prints Markdown tables: a header row is one long
-- string.
files["bench/summary.lua"] = { max_line_length = false }
