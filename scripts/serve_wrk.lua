-- wrk's script for scripts/serve_wrk.py: every request POSTs one random sentence to /v1/translate.
--
--   wrk -t 1 -c 32 -d 15s --timeout 330s -s serve_wrk.lua http://127.0.0.1:PORT/v1/translate \
--       -- WORDS SEP BEAM LEN_LO LEN_HI SEED [DUMP]
--
-- WORDS: a file of words, one per line, each already escaped for a JSON string (serve_wrk.py writes it).
-- SEP: "space" joins the words with spaces, "none" without (Chinese, Japanese).
-- BEAM: the request's beam_size (1 is greedy).
-- LEN_LO LEN_HI: each request's max_decoding_length drawn uniformly from LEN_LO..LEN_HI; 0 0 leaves it out.
-- SEED: the random seed (each wrk thread adds its own number to it).
-- DUMP: optional; each thread appends its request bodies to DUMP.<thread> (the tests read them).
--
-- A sentence is 3 to 10 words drawn uniformly with replacement. done() prints one line
-- "SERVE_WRK {json}" (latencies in microseconds) that serve_wrk.py parses; wrk's own report is kept too.

local words, sep, beam, lo, hi, dump = {}, " ", 1, 0, 0, nil
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  local f = assert(io.open(args[1], "r"))
  for line in f:lines() do
    if #line > 0 then words[#words + 1] = line end
  end
  f:close()
  assert(#words > 0, "no words in " .. args[1])
  sep = (args[2] == "none") and "" or " "
  beam = tonumber(args[3])
  lo, hi = tonumber(args[4]), tonumber(args[5])
  math.randomseed(tonumber(args[6]) + 7919 * (id or 0))
  if args[7] and #args[7] > 0 then dump = assert(io.open(args[7] .. "." .. (id or 0), "a")) end
  wrk.headers["Content-Type"] = "application/json"
end

function body()
  local parts = {}
  for i = 1, math.random(3, 10) do parts[i] = words[math.random(#words)] end
  local b = '{"texts": ["' .. table.concat(parts, sep) .. '"], "beam_size": ' .. beam
  if hi > 0 then b = b .. ', "max_decoding_length": ' .. math.random(lo, hi) end
  return b .. "}"
end

function request()
  local b = body()
  if dump then dump:write(b, "\n"); dump:flush() end
  return wrk.format("POST", nil, nil, b)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'SERVE_WRK {"duration_us": %d, "requests": %d, "bytes": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "mean_us": %.1f, "p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
