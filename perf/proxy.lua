-- wrk script for forward proxies: absolute-form requests. SORTIE_PERF_TARGET is the absolute URL
-- of the upstream resource, SORTIE_PERF_TARGET_HOST its authority (the Host field),
-- SORTIE_PERF_PROXY_AUTH the base64 of "user:password" (empty: no Proxy-Authorization) and
-- SORTIE_PERF_DIR the folder holding report.lua.
local target = os.getenv("SORTIE_PERF_TARGET")
local host = os.getenv("SORTIE_PERF_TARGET_HOST")
local auth = os.getenv("SORTIE_PERF_PROXY_AUTH")
local dir = os.getenv("SORTIE_PERF_DIR")
if not target or not host or not dir then
  error("set SORTIE_PERF_TARGET, SORTIE_PERF_TARGET_HOST and SORTIE_PERF_DIR")
end

wrk.path = target
wrk.headers["Host"] = host
if auth and auth ~= "" then
  wrk.headers["Proxy-Authorization"] = "Basic " .. auth
end

dofile(dir .. "/report.lua")
