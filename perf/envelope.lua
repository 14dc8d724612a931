-- wrk script for the gateway: every request POSTs the same JSON envelope with the bearer token.
-- SORTIE_PERF_URL is the upstream URL the envelope names, SORTIE_PERF_TOKEN the deployment token
-- and SORTIE_PERF_DIR the folder holding report.lua (the shared end-of-run summary).
local url = os.getenv("SORTIE_PERF_URL")
local token = os.getenv("SORTIE_PERF_TOKEN")
local dir = os.getenv("SORTIE_PERF_DIR")
if not url or not token or not dir then
  error("set SORTIE_PERF_URL, SORTIE_PERF_TOKEN and SORTIE_PERF_DIR")
end

-- SORTIE_PERF_PROFILE, when set, names a fingerprint profile for every request (perf/h2.sh).
local profile = os.getenv("SORTIE_PERF_PROFILE")
local extra = ""
if profile and profile ~= "" then
  extra = string.format(',"fingerprint_profile":"%s"', profile)
end

wrk.method = "POST"
wrk.body = string.format('{"method":"GET","url":"%s","timeout_ms":5000%s}', url, extra)
wrk.headers["Authorization"] = "Bearer " .. token
wrk.headers["Content-Type"] = "application/json"

dofile(dir .. "/report.lua")
