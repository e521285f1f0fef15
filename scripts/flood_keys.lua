-- wrk's script for scripts/flood_keys.py: POSTs DeepL's /v2/translate with one of KEYS per request.
--
--   wrk -t 1 -c C -d 10s -s flood_keys.lua http://127.0.0.1:PORT/v2/translate -- KEYS DELAY_MS [get]
--
-- KEYS: comma-separated keys, used in turn; DELAY_MS: wrk waits this long before each request of a
-- connection (0: closed loop, as fast as answers come); get: GETs instead (the baseline's pacer on /health,
-- which loads the client side as the flooder does). done() prints one line "FLOOD {json}": requests,
-- non-2xx answers, latency percentiles in microseconds.

local keys, pause, n, get = {}, 0, 0, false
local sentences = {"the queen sees young mice with an old box", "a black dog ate five brave cats near the car",
                   "the small teacher found sad children under the garden"}

function init(args)
  for k in string.gmatch(args[1], "[^,]+") do keys[#keys + 1] = k end
  pause = tonumber(args[2])
  get = args[3] == "get"
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
end

function request()
  n = n + 1
  wrk.headers["Authorization"] = "DeepL-Auth-Key " .. keys[(n % #keys) + 1]
  if get then return wrk.format("GET") end
  local text = string.gsub(sentences[(n % #sentences) + 1], " ", "+")
  return wrk.format(nil, nil, nil, "target_lang=FR&text=" .. text)
end

function delay()
  return pause
end

function done(summary, latency, requests)
  io.write(string.format('FLOOD {"requests": %d, "non_2xx": %d, "seconds": %.3f, "p50": %d, "p90": %d, ' ..
                         '"p99": %d, "max": %d}\n', summary.requests, summary.errors.status,
                         summary.duration / 1e6, latency:percentile(50), latency:percentile(90),
                         latency:percentile(99), latency.max))
end
