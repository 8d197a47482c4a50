-- wrk script: POST a payment with an Idempotency-Key chosen by mode, print a JSON summary.
-- Arguments: mode (none | unique | mix | pool | fixed), key prefix, pool size.
-- mix: 95 % first requests, and every 20th request a retry of one this thread sent 19 before
-- (a first request itself, long answered by then).
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  mode, prefix, pool = args[1], args[2], tonumber(args[3] or "1")
  n = 0
  body = '{"amount": 100, "currency": "EUR", "description": "benchmark"}'
end

function request()
  n = n + 1
  local headers = { ["Content-Type"] = "application/json" }
  if mode == "unique" then
    headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. n
  elseif mode == "mix" then
    local number = n
    if n % 20 == 0 and n > 19 then number = n - 19 end
    headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. number
  elseif mode == "pool" then
    headers["Idempotency-Key"] = prefix .. "-" .. (n % pool)
  elseif mode == "fixed" then
    headers["Idempotency-Key"] = prefix
  end
  return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nRESULT {"requests": %d, "duration_us": %d, "socket_errors": %d, "non_2xx": %d, ' ..
    '"p50_us": %d, "p95_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
