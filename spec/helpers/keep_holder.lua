-- Spec helper: the holder side of one keep-alive scenario
-- (spec/keepalive_table_spec.lua), the same code on either transport:
--
--   plain LuaJIT:  luajit -e 'require("helpers.keep_holder").run(DIR, require("helpers.proc").sleep_ms)'
--   inside nginx:  require("helpers.keep_holder").run(ngx.var.arg_dir, function(ms) ngx.sleep(ms / 1000) end)
--
-- DIR holds scenario.lua (a chunk returning function(T, A)) and args.lua (a
-- chunk returning A). The function's return value, or "error <why>", is
-- written to DIR/result. T gives it what differs by transport (sleep: a
-- blocking sleep in plain LuaJIT, where the keeper's thread runs meanwhile;
-- ngx.sleep inside nginx, where the hub runs meanwhile) and the files the
-- spec and the holder signal each other with.

local proc = require "helpers.proc"

local M = {}

function M.run(dir, sleep)
  local T = { dir = dir, sleep = sleep, now = proc.now_ms }

  --- Write the file name (text, default "1") for the spec to see.
  function T.mark(name, text) proc.write_file(dir .. "/" .. name, text or "1") end

  --- Wait (sleeping, at most ms) until the spec has written the file name.
  function T.await(name, ms)
    local deadline = proc.now_ms() + (ms or 10000)
    while (proc.read_file(dir .. "/" .. name) or "") == "" do
      if proc.now_ms() > deadline then error("no " .. name .. " from the spec within " .. ms .. " ms") end
      sleep(10)
    end
  end

  local ok, res = pcall(function()
    local A = assert(loadfile(dir .. "/args.lua"))()
    local body = assert(loadfile(dir .. "/scenario.lua"))()
    return body(T, A)
  end)
  proc.write_file(dir .. "/result", ok and tostring(res) or ("error " .. tostring(res)))
end

return M
