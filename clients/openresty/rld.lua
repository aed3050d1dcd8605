-- rld.lua: the OpenResty / nginx (lua-nginx-module) client of rld, the
-- rate-limit daemon. One file, no dependency beyond what OpenResty and
-- Debian's libnginx-mod-http-lua ship (cosockets, ngx.*).
--
--   local rld = require "rld"
--   -- in access_by_lua_block, the one-call helper:
--   rld.access{ socket = "unix:/run/rld/rld.sock", api_key_header = "X-API-Key" }
--   -- or by hand:
--   local c = rld.new{ timeout = 5 }
--   local res, err = c:check({ {"api_key", "sk_123"}, {"endpoint", "/v1/search"} }, 1)
--
-- It speaks the binary protocol of docs/protocol.md on the daemon's Unix
-- socket, one request at a time per connection, with connections kept in
-- the cosocket pool (setkeepalive). docs/clients.md describes it.

local ngx = ngx
local byte, char, sub, find, gsub = string.byte, string.char, string.sub, string.find, string.gsub
local concat, sort = table.concat, table.sort
local floor = math.floor
local type, pairs, ipairs, tostring, tonumber, setmetatable = type, pairs, ipairs, tostring, tonumber, setmetatable

local bit = require "bit"
local band, rshift = bit.band, bit.rshift

local _M = { _VERSION = "1.0" }

-- Ops, statuses and limits of the protocol (docs/protocol.md).
_M.OP_CHECK, _M.OP_PEEK, _M.OP_PING = 1, 2, 3
_M.OP_ACQUIRE, _M.OP_RELEASE, _M.OP_SETTLE = 5, 6, 7
local MAX_LEASE = 1024
_M.ALLOWED, _M.LIMITED, _M.BLOCKED, _M.ALLOWED_DEGRADED, _M.ERROR = 0, 1, 2, 3, 4
local STATUS_NAMES = { [0] = "allowed", "limited", "blocked", "allowed-degraded", "error" }
_M.STATUS_NAMES = STATUS_NAMES
_M.ERROR_NAMES = { [0] = "none", "malformed", "frame_too_large", "unknown_op", "bad_version",
    "too_large", "cost_too_large", "internal", "overloaded", "not_supported", "bad_flags",
    "unavailable", "bad_cost", "forbidden", "not_found" }
local MAX_FRAME, MAX_DESCS, MAX_NAME, MAX_VALUE, MAX_MESSAGE = 16384, 32, 64, 1024, 1024
local MAX_U32 = 4294967295

local function u16(n)
    return char(floor(n / 256) % 256, n % 256)
end

local function u32(n)
    return char(floor(n / 16777216) % 256, floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
end

local function rd16(s, i)
    local a, b = byte(s, i, i + 1)
    return a * 256 + b
end

local function rd32(s, i)
    local a, b, c, d = byte(s, i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
end

-- rd64 reads 8 bytes as a Lua number, or returns nil above 2^53, where a
-- Lua number no longer holds every integer exactly.
local function rd64(s, i)
    local hi, lo = rd32(s, i), rd32(s, i + 4)
    if hi > 2097152 or (hi == 2097152 and lo > 0) then
        return nil
    end
    return hi * 4294967296 + lo
end

local function by_name(a, b)
    return a[1] < b[1]
end

-- map_pairs returns the pairs of a map {api_key = "k"}, sorted by name.
-- It is apart from pairs_of because LuaJIT does not compile next() and
-- pairs(): a list, the common case, stays on compiled code.
local function map_pairs(descs)
    local list = {}
    for k, v in pairs(descs) do
        list[#list + 1] = { k, v }
    end
    sort(list, by_name)
    return list
end

local EMPTY = {}

-- pairs_of turns descriptors into a list of {name, value}: a list of pairs
-- stays as it is (order kept, duplicate names allowed); a map
-- {api_key = "k"} is sorted by name.
local function pairs_of(descs)
    if descs == nil then
        return EMPTY
    end
    if descs[1] ~= nil then
        return descs
    end
    return map_pairs(descs)
end

-- LuaJIT's string.buffer (LuaJIT 2.1 since 2021) builds a frame in one
-- buffer; without it, encode concatenates a table of parts.
local has_buffer, strbuf = pcall(require, "string.buffer")
local ebuf = has_buffer and strbuf.new(512) or nil

--- encode(id, op, cost, descs, lease) returns the request frame (a
-- string), or nil and an error for a request the protocol cannot carry
-- (more than 32 descriptors, an empty or 65-byte name, a 1025-byte value,
-- a cost that does not fit in 4 bytes, a frame over 16384 bytes, a lease
-- that is empty or over 1024 bytes). CHECK (1), PEEK (2) and ACQUIRE (5)
-- carry cost and descriptors; RELEASE (6) carries lease, and SETTLE (7)
-- cost and lease; other ops have an empty body.
function _M.encode(id, op, cost, descs, lease)
    if op == 6 or op == 7 then
        if type(lease) ~= "string" or #lease == 0 or #lease > MAX_LEASE then
            return nil, "lease of " .. (type(lease) == "string" and #lease or 0) .. " bytes (1 to 1024)"
        end
        local head = ""
        if op == 7 then
            cost = cost or 1
            if type(cost) ~= "number" or cost < 0 or cost > MAX_U32 or cost ~= floor(cost) then
                return nil, "cost " .. tostring(cost) .. " is not a whole number from 0 to 4294967295"
            end
            head = u32(cost)
        end
        local body = head .. u16(#lease) .. lease
        return u32(8 + #body) .. char(1, op, 0, 0) .. u32(id) .. body
    end
    if op ~= 1 and op ~= 2 and op ~= 5 then
        return u32(8) .. char(1, op, 0, 0) .. u32(id)
    end
    cost = cost or 1
    if type(cost) ~= "number" or cost < 0 or cost > MAX_U32 or cost ~= floor(cost) then
        return nil, "cost " .. tostring(cost) .. " is not a whole number from 0 to 4294967295"
    end
    local list = pairs_of(descs)
    local n = #list
    if n > MAX_DESCS then
        return nil, n .. " descriptors, more than " .. MAX_DESCS
    end
    -- First pass: check the sizes, and turn names and values into strings.
    local size = 16 + 1
    for i = 1, n do
        local d = list[i]
        local name, value = d[1], d[2]
        if type(name) ~= "string" then
            name = tostring(name)
        end
        if type(value) ~= "string" then
            value = tostring(value or "")
        end
        local nl, vl = #name, #value
        if nl == 0 or nl > MAX_NAME then
            return nil, "descriptor name of " .. nl .. " bytes (1 to 64)"
        end
        if vl > MAX_VALUE then
            return nil, "descriptor " .. name .. ": value of " .. vl .. " bytes (at most 1024)"
        end
        size = size + 3 + nl + vl
    end
    if size > MAX_FRAME then
        return nil, "frame of " .. size .. " bytes, more than " .. MAX_FRAME
    end
    local head = u32(size - 4) .. char(1, op, 0, 0) .. u32(id) .. u32(cost) .. char(n)
    if ebuf then
        ebuf:reset():put(head)
        for i = 1, n do
            local d = list[i]
            local name, value = tostring(d[1]), tostring(d[2] or "")
            local vl = #value
            ebuf:put(char(#name), name, char(floor(vl / 256), vl % 256), value)
        end
        return ebuf:tostring()
    end
    local parts = { head }
    for i = 1, n do
        local d = list[i]
        local name, value = tostring(d[1]), tostring(d[2] or "")
        parts[i + 1] = char(#name) .. name .. u16(#value) .. value
    end
    return concat(parts)
end

--- decode(frame) decodes a complete response frame (length prefix
-- included) into a table {id, op, flags, status, limit, remaining, reset,
-- retry, window, quota, quota_window, next, rule, code, message, lease,
-- allowed, status_name} (lease: an ACQUIRE answer's, "" for the others;
-- allowed: true for allowed and allowed-degraded; times in
-- milliseconds; op is the byte as sent, e.g. 129; next is 4294967295 when
-- the daemon does not know when quota comes back), or returns nil and an
-- error. Unknown flag bits are passed through. A limit, remaining or
-- quota above 2^53, which a Lua number cannot hold exactly, is refused.
function _M.decode(f)
    local n = #f
    if n < 12 then
        return nil, "truncated frame: " .. n .. " bytes"
    end
    local length = rd32(f, 1)
    if length < 8 then
        return nil, "length field " .. length .. " below 8"
    end
    if length > MAX_FRAME - 4 then
        return nil, "length field " .. length .. " above 16380"
    end
    if n < length + 4 then
        return nil, "truncated frame: " .. n .. " bytes, length field says " .. (length + 4)
    end
    if n > length + 4 then
        return nil, (n - length - 4) .. " bytes left over after the frame"
    end
    if byte(f, 5) ~= 1 then
        return nil, "bad version " .. byte(f, 5)
    end
    local op = byte(f, 6)
    if op < 128 then
        return nil, "op " .. op .. " is not a response (0x80 unset)"
    end
    if n < 12 + 50 then
        return nil, "truncated response body: " .. (n - 12) .. " bytes"
    end
    local status = byte(f, 13)
    if status > 4 then
        return nil, "unknown status " .. status
    end
    local rl = byte(f, 58)
    if n < 58 + rl + 4 then
        return nil, "rule of " .. rl .. " bytes runs past the end"
    end
    local p = 59 + rl
    local ml = rd16(f, p + 2)
    if ml > MAX_MESSAGE then
        return nil, "message of " .. ml .. " bytes, more than 1024"
    end
    if n < p + 3 + ml then
        return nil, "message of " .. ml .. " bytes runs past the end"
    end
    local lease = ""
    if op == 0x85 then
        -- An ACQUIRE answer ends with its lease: u16 length, bytes.
        local q = p + 4 + ml
        if n < q + 1 then
            return nil, "ACQUIRE answer without its lease length"
        end
        local ll = rd16(f, q)
        if ll > MAX_LEASE then
            return nil, "lease of " .. ll .. " bytes, more than 1024"
        end
        if n ~= q + 1 + ll then
            return nil, "lease of " .. ll .. " bytes with " .. (n - q - 1) .. " bytes left"
        end
        lease = sub(f, q + 2, n)
        n = q - 1
    end
    if n > p + 3 + ml then
        return nil, "bytes left over after the message"
    end
    local limit, remaining, quota = rd64(f, 14), rd64(f, 22), rd64(f, 42)
    if not limit or not remaining or not quota then
        return nil, "limit, remaining or quota above 2^53"
    end
    return {
        id = rd32(f, 9),
        op = op,
        flags = rd16(f, 7),
        status = status,
        limit = limit,
        remaining = remaining,
        reset = rd32(f, 30),
        retry = rd32(f, 34),
        window = rd32(f, 38),
        quota = quota,
        quota_window = rd32(f, 50),
        next = rd32(f, 54),
        rule = sub(f, 59, 58 + rl),
        code = rd16(f, p),
        message = sub(f, p + 4, p + 3 + ml),
        lease = lease,
        -- Here rather than set by the caller: a table made with all its
        -- fields is not grown (and rehashed) afterwards.
        allowed = status == 0 or status == 3,
        status_name = STATUS_NAMES[status],
    }
end

local Client = {}
Client.__index = Client

--- new(opts) returns a client. opts (all optional):
--   socket        "unix:/run/rld/rld.sock"
--   timeout       5 (ms): connect, send and receive, each
--   pool_size     64 connections kept per nginx worker
--   keepalive     60000 (ms) a pooled connection may idle
--   pipeline      true: a worker's concurrent checks share one connection
--                 and go out in batches (see below); false: each check
--                 takes a connection of the cosocket pool
--   reconnect_after  200 (ms): after a connect to the socket failed, the
--                 worker's checks fail at once for this long, without a
--                 connect (each failed connect costs a system call and a
--                 line in nginx's error log); 0 connects every time
function _M.new(opts)
    opts = opts or {}
    local c = {
        socket = opts.socket or "unix:/run/rld/rld.sock",
        timeout = opts.timeout or 5,
        pool_size = opts.pool_size or 64,
        keepalive = opts.keepalive or 60000,
        pipeline = opts.pipeline ~= false,
        reconnect_after = opts.reconnect_after or 200,
    }
    return setmetatable(c, Client)
end

local down = {} -- socket -> { till = ngx.now() seconds, err = message }: the worker's last failed connect

-- held_down returns the error of c's socket while a failed connect to it
-- is less than c.reconnect_after old, else nil.
local function held_down(c)
    if c.reconnect_after <= 0 then
        return nil -- this client connects every time
    end
    local d = down[c.socket]
    if d and ngx.now() < d.till then
        return d.err
    end
    return nil
end

-- connect connects sock to c's socket; after a failure it returns nil
-- and an error, and held_down answers for c.reconnect_after.
local function connect(c, sock)
    local err = held_down(c)
    if err then
        return nil, err
    end
    local ok, cerr = sock:connect(c.socket)
    if ok then
        down[c.socket] = nil
        return true
    end
    err = "connect " .. c.socket .. ": " .. tostring(cerr)
    if c.reconnect_after > 0 then
        down[c.socket] = { till = ngx.now() + c.reconnect_after / 1000,
            err = err .. " (not tried again for " .. c.reconnect_after .. " ms)" }
    end
    return nil, err
end

local next_id = 0

-- new_id returns the next request id of this worker.
local function new_id()
    next_id = (next_id + 1) % 4294967296
    return next_id
end

-- retryable reports whether a failed exchange on a pooled connection
-- may be repeated on a new one: the daemon closed it (a restart, an idle
-- timeout) before the request reached it.
local function retryable(err)
    return err == "closed" or err == "broken pipe" or err == "connection reset by peer"
end

-- exchange sends one request and returns the decoded answer, or nil and
-- an error.
function Client:exchange(op, descs, cost, lease)
    local id = new_id()
    local frame, err = _M.encode(id, op, cost, descs, lease)
    if not frame then
        return nil, err
    end
    return self:roundtrip(id, frame)
end

-- roundtrip sends frame, a request with id, and returns the decoded
-- answer, or nil and an error.
function Client:roundtrip(id, frame)
    local err
    if self.pipeline then
        return self:pipelined(id, frame)
    end
    for attempt = 1, 2 do
        local sock = ngx.socket.tcp()
        sock:settimeouts(self.timeout, self.timeout, self.timeout)
        local ok, cerr = connect(self, sock)
        if not ok then
            return nil, cerr
        end
        local reused = sock:getreusedtimes() > 0
        local res
        ok, err = sock:send(frame)
        if ok then
            res, err = self:receive(sock, id)
        end
        if res then
            sock:setkeepalive(self.keepalive, self.pool_size)
            return res
        end
        sock:close()
        if not (reused and attempt == 1 and retryable(err)) then
            return nil, err
        end
    end
end

-- receive reads frames until the one answering id.
function Client:receive(sock, id)
    while true do
        local head, err = sock:receive(4)
        if not head then
            return nil, err
        end
        local length = rd32(head, 1)
        if length < 8 or length > MAX_FRAME - 4 then
            return nil, "bad length field " .. length
        end
        local body
        body, err = sock:receive(length)
        if not body then
            return nil, err
        end
        local res, derr = _M.decode(head .. body)
        if not res then
            return nil, "bad answer: " .. derr
        end
        if res.id == id then
            return res
        end
    end
end

-- Pipelining: with pipeline = true, the checks of a worker's concurrent
-- requests share one connection, owned by a timer: a request queues its
-- frame and waits on a semaphore; the timer writes every queued frame in
-- one send, reads the answers and wakes each request with its own (by
-- id). One write and one read serve many checks, on both sides.

local pipes = {} -- by socket and timeout, per worker

-- fail_all wakes the waiting requests of ids with err.
local function fail_all(p, ids, err)
    for i = 1, #ids do
        local w = p.waiters[ids[i]]
        if w and not w.posted then
            w.err, w.posted = err, true
            w.sema:post(1)
        end
    end
end

-- run_batch sends frames (for ids) on p.sock, connecting when needed,
-- and dispatches the answers; it returns nil and an error when it failed.
local function run_batch(p, c, frames, ids)
    local reused = p.sock ~= nil
    if not p.sock then
        local sock = ngx.socket.tcp()
        sock:settimeouts(c.timeout, c.timeout, c.timeout)
        local ok, err = connect(c, sock)
        if not ok then
            return nil, err, false
        end
        p.sock = sock
    end
    local sock = p.sock
    local ok, err = sock:send(frames)
    local pending, left = {}, #ids
    for i = 1, left do
        pending[ids[i]] = true
    end
    -- The answers are read as they come, many in one read, and cut into
    -- frames here.
    local buf, pos = "", 1
    while ok and left > 0 do
        local avail, need = #buf - pos + 1, 4
        if avail >= 4 then
            local length = rd32(buf, pos)
            if length < 8 or length > MAX_FRAME - 4 then
                err = "bad length field " .. length
                break
            end
            need = length + 4
        end
        if avail < need then
            local data
            data, err = sock:receiveany(65536)
            if not data then
                break
            end
            if avail > 0 then
                buf = sub(buf, pos) .. data
            else
                buf = data
            end
            pos = 1
            goto continue
        end
        local frame = sub(buf, pos, pos + need - 1)
        pos = pos + need
        local res, derr = _M.decode(frame)
        if not res then
            err = "bad answer: " .. derr
            break
        end
        if pending[res.id] then
            pending[res.id] = nil
            left = left - 1
            local w = p.waiters[res.id]
            if w and not w.posted then -- else the request gave up waiting
                w.res, w.posted = res, true
                w.sema:post(1)
            end
        end
        ::continue::
    end
    if left == 0 then
        return true
    end
    sock:close()
    p.sock = nil
    return nil, err, reused and retryable(err)
end

-- pipe_loop is the timer owning a pipe's connection.
local function pipe_loop(premature, p, c)
    if premature then
        p.running = false
        return
    end
    local ok, perr = pcall(function()
        while not ngx.worker.exiting() do
            if #p.queue == 0 then
                p.idle = true
                p.wake:wait(1)
                p.idle = false
            end
            local n = #p.queue
            if n > 0 then
                local frames, ids = concat(p.queue), p.ids
                p.queue, p.ids = {}, {}
                local done, err, retry = run_batch(p, c, frames, ids)
                if not done and retry then
                    -- The daemon closed the connection (a restart): the
                    -- unanswered requests go again on a new one.
                    local again, afr = {}, {}
                    for i = 1, #ids do
                        local w = p.waiters[ids[i]]
                        if w and not w.res then
                            again[#again + 1] = ids[i]
                            afr[#afr + 1] = w.frame
                        end
                    end
                    done, err = run_batch(p, c, concat(afr), again)
                    ids = again
                end
                if not done then
                    fail_all(p, ids, err)
                end
            end
        end
    end)
    if p.sock then
        p.sock:close()
        p.sock = nil
    end
    p.running = false
    if not ok then
        ngx.log(ngx.ERR, "rld: pipeline stopped: ", perr)
    end
end

local semaphore
function Client:pipelined(id, frame)
    semaphore = semaphore or require("ngx.semaphore")
    -- One pipe per socket and timeout: the timer uses the timeout for
    -- its connect, send and receive.
    local p = self._pipe
    if not p then
        local key = self.socket .. "|" .. self.timeout
        p = pipes[key]
    end
    if not p then
        p = { queue = {}, ids = {}, waiters = {}, free = {}, wake = semaphore.new(0), idle = false, running = false }
        pipes[self.socket .. "|" .. self.timeout] = p
    end
    self._pipe = p
    if not p.running then
        local ok, err = ngx.timer.at(0, pipe_loop, p, self)
        if not ok then
            return nil, "cannot start the pipeline timer: " .. tostring(err)
        end
        p.running = true
    end
    -- Waiters (and their semaphores, which cost an allocation and a
    -- finaliser) are reused once their one post has been consumed.
    local free = p.free
    local w = free[#free]
    if w then
        free[#free] = nil
        w.frame, w.res, w.err, w.posted = frame, nil, nil, false
    else
        w = { sema = semaphore.new(0), frame = frame, posted = false }
    end
    p.waiters[id] = w
    p.queue[#p.queue + 1] = frame
    p.ids[#p.ids + 1] = id
    if p.idle then
        p.wake:post(1)
    end
    -- Wait for the batch: its connect, send and receive, each up to
    -- timeout, and a batch before it.
    local ok = w.sema:wait(self.timeout * 3 / 1000)
    p.waiters[id] = nil
    local res, err = w.res, w.err
    w.res, w.err, w.frame = nil, nil, nil
    if ok and #free < 1024 then
        free[#free + 1] = w
    end
    if res then
        return res
    end
    if not ok then
        return nil, "timeout"
    end
    return nil, err
end

--- check(descriptors, cost) asks whether a request may go and takes cost
-- (default 1) when it may. descriptors is a list of {name, value} or a
-- map {name = value}. Returns the decoded answer, with .allowed (true for
-- allowed and allowed-degraded) and .status_name, or nil and an error when
-- the daemon could not be asked. An answer may have status ERROR (4):
-- see .code and .message.
function Client:check(descs, cost)
    return self:exchange(1, descs, cost)
end

--- peek(descriptors, cost) decides as check would but takes nothing.
function Client:peek(descs, cost)
    return self:exchange(2, descs, cost)
end

--- ping() returns a PING's answer, or nil and an error.
function Client:ping()
    return self:exchange(3)
end

--- acquire(descriptors, cost) answers as check does, and the concurrency
-- rules that apply hold a slot until release or settle of the answer's
-- .lease ("" when it took nothing), or their timeout.
function Client:acquire(descs, cost)
    return self:exchange(5, descs, cost)
end

--- release(lease) gives back the slots of an acquire's lease. An unknown
-- lease answers status ERROR, code 14 (not_found).
function Client:release(lease)
    return self:exchange(6, nil, 0, lease)
end

--- settle(lease, cost) ends an acquire at its actual cost: the difference
-- from its estimate is charged or refunded, and its slots go back.
function Client:settle(lease, cost)
    return self:exchange(7, nil, cost, lease)
end

_M.Client = Client

-- Header rendering, the same as rld's HTTP endpoint (package header).

local function seconds(ms)
    if ms <= 0 then
        return 0
    end
    return floor((ms + 999) / 1000)
end

-- sf_string renders a rule name as a structured-field string.
local function sf_string(s)
    return '"' .. gsub(s, '[%c"\\\128-\255]', function(c)
        if c == '"' or c == "\\" then
            return "\\" .. c
        end
        return "?"
    end) .. '"'
end

-- num renders a whole number in decimal (tostring would switch to an
-- exponent above 1e14).
local function num(n)
    if n < 1e14 then
        return tostring(n)
    end
    return string.format("%.0f", n)
end

-- The parts of the header fields that depend only on the rule, its quota
-- and its windows, rendered once per rule (per worker).
local rendered = {}
local nrendered = 0

local function rule_fields(res)
    local r = rendered[res.rule]
    local w = res.quota_window
    if w == 0 then
        w = res.window
    end
    if r and r.quota == res.quota and r.w == w then
        return r
    end
    if nrendered >= 1024 then -- rules with ever-new names: start again
        rendered, nrendered = {}, 0
    end
    local quoted = sf_string(res.rule)
    local policy
    if res.quota > 0 then
        policy = quoted .. ";q=" .. num(res.quota)
        if w > 0 then
            policy = policy .. ";w=" .. seconds(w)
        end
    end
    r = { quota = res.quota, w = w, quoted = quoted .. ";r=", policy = policy }
    if not rendered[res.rule] then
        nrendered = nrendered + 1
    end
    rendered[res.rule] = r
    return r
end

-- fields renders the header fields of an answer, in order, through
-- put(h, name, value): one rendering for headers() and for access(),
-- which sets them on the response without a table in between. now is
-- ngx.now() when nil: read here, on code LuaJIT compiles.
local function fields(res, now, put, h)
    now = now or ngx.now()
    local r = rule_fields(res)
    local limit = res.limit
    if r.limit ~= limit then
        r.limit, r.limit_s = limit, num(limit)
    end
    local remaining = num(res.remaining)
    put(h, "X-RateLimit-Limit", r.limit_s)
    put(h, "X-RateLimit-Remaining", remaining)
    -- Many answers in a row share their reset second: the last one's
    -- rendering is kept.
    local reset = floor(now + res.reset / 1000 + 0.999999999)
    if r.reset ~= reset then
        r.reset, r.reset_s = reset, num(reset)
    end
    put(h, "X-RateLimit-Reset", r.reset_s)
    if r.policy then
        put(h, "RateLimit-Policy", r.policy)
    end
    if res.next ~= MAX_U32 then
        put(h, "RateLimit", r.quoted .. remaining .. ";t=" .. seconds(res.next))
    else
        put(h, "RateLimit", r.quoted .. remaining)
    end
    if res.retry > 0 then
        put(h, "Retry-After", tostring(math.max(1, seconds(res.retry))))
    end
end

local function put_field(h, name, value)
    h[#h + 1] = name
    h[name] = value
end

--- headers(res, now) returns the response header fields for an answer,
-- as docs/protocol.md ("Rendering HTTP headers") and rld's HTTP endpoint
-- render them: h[1], h[2], ... are the field names in order and h[name]
-- each value. X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset
-- (Unix seconds), RateLimit-Policy (when the quota is known), RateLimit
-- (with t when the daemon knows when quota comes back) and Retry-After
-- (when there is a retry-after). It is empty when no limit applied (no
-- rule, or the allow and deny lists).
function _M.headers(res, now)
    local h = {}
    if res.rule ~= "" and res.limit ~= 0 then
        fields(res, now, put_field, h)
    end
    return h
end

local function set_field(_, name, value)
    ngx.header[name] = value
end

local function json_string(s)
    return '"' .. gsub(s, '[%c"\\]', function(c)
        if c == '"' or c == "\\" then
            return "\\" .. c
        end
        return string.format("\\u%04x", byte(c))
    end) .. '"'
end

--- limited_body(res, now) returns the JSON body of a 429, the same as
-- rld's HTTP endpoint writes.
function _M.limited_body(res, now)
    now = now or ngx.now()
    local retry = math.max(1, seconds(math.max(res.retry, 1)))
    return '{"error":{"code":"RATE_LIMIT_EXCEEDED","message":'
        .. json_string("rate limit " .. json_string(res.rule) .. " exceeded; retry after " .. retry .. "s")
        .. ',"details":{"rule":' .. json_string(res.rule)
        .. ',"limit":' .. num(res.limit)
        .. ',"window_seconds":' .. seconds(res.window)
        .. ',"retry_after_seconds":' .. retry
        .. ',"reset_at":' .. num(floor(now + res.reset / 1000 + 0.999999999))
        .. "}}}\n"
end

_M.BLOCKED_BODY = '{"error":{"code":"BLOCKED","message":"request blocked by the deny list"}}\n'

-- The access helper.

local by_socket = {} -- socket -> timeout -> pipeline -> client

-- client_for returns the client for opts, found by socket, timeout and
-- mode rather than by the table: the recipe writes its options as a table
-- literal, a new table every request.
local function client_for(opts)
    local socket, timeout = opts.socket or "unix:/run/rld/rld.sock", opts.timeout or 5
    local t = by_socket[socket]
    if not t then
        t = {}
        by_socket[socket] = t
    end
    local m = t[timeout]
    if not m then
        m = {}
        t[timeout] = m
    end
    local pipeline = opts.pipeline ~= false
    local c = m[pipeline]
    if not c or c.pool_size ~= (opts.pool_size or 64) or c.keepalive ~= (opts.keepalive or 60000)
        or c.reconnect_after ~= (opts.reconnect_after or 200) then
        c = _M.new(opts)
        m[pipeline] = c
    end
    return c
end
local last_log = 0 -- per worker, when there is no shared dict

-- failed counts a failure to ask the daemon and logs it at most once per
-- interval (across workers when a shared dict is configured).
local function failed(opts, err)
    local interval = opts.log_interval or 10
    local dict = opts.shared_dict and ngx.shared[opts.shared_dict]
    if dict then
        local n = dict:incr("rld:failures", 1, 0)
        if dict:add("rld:logged", true, interval) then
            ngx.log(ngx.WARN, "rld: cannot check (", err, "); ", n, " failures so far; failing ",
                opts.fail_open == false and "closed" or "open")
        end
        return
    end
    local now = ngx.now()
    if now - last_log >= interval then
        last_log = now
        ngx.log(ngx.WARN, "rld: cannot check (", err, "); failing ", opts.fail_open == false and "closed" or "open")
    end
end

--- failures(dict_name) returns how many checks failed to reach the daemon,
-- as counted in the shared dict.
function _M.failures(dict_name)
    local dict = ngx.shared[dict_name]
    return dict and dict:get("rld:failures") or 0
end

-- endpoint returns the request path without query and with slashes
-- collapsed.
local function endpoint()
    local uri = ngx.var.uri or "/"
    if find(uri, "//", 1, true) then
        uri = gsub(uri, "//+", "/")
    end
    return uri
end

--- descriptors(opts) returns the descriptors of the current request:
-- ip (ngx.var.remote_addr, which honours set_real_ip_from and
-- real_ip_header), api_key (from the header opts.api_key_header, when
-- present), endpoint (the normalised path), method, then the pairs of
-- opts.descriptors (a list of {name, value} or a map) and of
-- opts.descriptors_fn() (per request). Set opts.ip, opts.endpoint or
-- opts.method to false to leave one out.
local header_vars = {} -- header name -> nginx variable name

local function append(d, list)
    list = pairs_of(list)
    local n = #d
    for i = 1, #list do
        d[n + i] = list[i]
    end
end

function _M.descriptors(opts)
    local var = ngx.var
    local d, n = {}, 0
    if opts.ip ~= false then
        n = n + 1
        d[n] = { "ip", var.remote_addr }
    end
    local hdr = opts.api_key_header
    if hdr == nil then
        hdr = "X-API-Key"
    end
    if hdr then
        local name = header_vars[hdr]
        if not name then
            name = "http_" .. gsub(hdr:lower(), "-", "_")
            header_vars[hdr] = name
        end
        local key = var[name]
        if key and key ~= "" then
            n = n + 1
            d[n] = { "api_key", key }
        end
    end
    if opts.endpoint ~= false then
        n = n + 1
        d[n] = { "endpoint", endpoint() }
    end
    if opts.method ~= false then
        n = n + 1
        d[n] = { "method", ngx.req.get_method() }
    end
    if opts.descriptors then
        append(d, opts.descriptors)
    end
    if opts.descriptors_fn then
        local list = opts.descriptors_fn()
        if list then
            append(d, list)
        end
    end
    return d
end

-- The request's own descriptors, as a frame carries them: the name's
-- length byte and the name.
local NAME_IP, NAME_KEY, NAME_ENDPOINT, NAME_METHOD = "\2ip", "\7api_key", "\8endpoint", "\6method"

-- vlen returns a value's length as a frame carries it (u16).
local function vlen(v)
    local n = #v
    return char(rshift(n, 8), band(n, 255))
end

-- too_long returns encode's error for a value over 1024 bytes.
local function too_long(name, v)
    return nil, "descriptor " .. name .. ": value of " .. #v .. " bytes (at most 1024)"
end

--- request_frame(opts, id, op, cost) returns the frame that access(opts)
-- sends for the current request: the same bytes as encode(id, op, cost,
-- descriptors(opts)), or nil and encode's error. Unless opts adds
-- descriptors of its own, it is built in one concatenation, without the
-- tables of descriptors() or a pass over them: straight-line code that
-- LuaJIT compiles.
function _M.request_frame(opts, id, op, cost)
    if opts.descriptors or opts.descriptors_fn then
        return _M.encode(id, op, cost, _M.descriptors(opts))
    end
    cost = cost or 1
    if type(cost) ~= "number" or cost < 0 or cost > MAX_U32 or cost ~= floor(cost) then
        return nil, "cost " .. tostring(cost) .. " is not a whole number from 0 to 4294967295"
    end
    local var = ngx.var
    local n, size = 0, 17
    local nip, ip, nkey, key, nep, ep, nm, m = "", "", "", "", "", "", "", ""
    if opts.ip ~= false then
        ip = var.remote_addr or ""
        if #ip > MAX_VALUE then
            return too_long("ip", ip)
        end
        nip, n, size = NAME_IP, n + 1, size + 5 + #ip
    end
    local hdr = opts.api_key_header
    if hdr == nil then
        hdr = "X-API-Key"
    end
    if hdr then
        local name = header_vars[hdr]
        if not name then
            name = "http_" .. gsub(hdr:lower(), "-", "_")
            header_vars[hdr] = name
        end
        local v = var[name]
        if v and v ~= "" then
            if #v > MAX_VALUE then
                return too_long("api_key", v)
            end
            nkey, key, n, size = NAME_KEY, v, n + 1, size + 10 + #v
        end
    end
    if opts.endpoint ~= false then
        ep = endpoint()
        if #ep > MAX_VALUE then
            return too_long("endpoint", ep)
        end
        nep, n, size = NAME_ENDPOINT, n + 1, size + 11 + #ep
    end
    if opts.method ~= false then
        m = ngx.req.get_method()
        if #m > MAX_VALUE then
            return too_long("method", m)
        end
        nm, n, size = NAME_METHOD, n + 1, size + 9 + #m
    end
    local l = size - 4
    return char(rshift(l, 24), band(rshift(l, 16), 255), band(rshift(l, 8), 255), band(l, 255), 1, op, 0, 0,
        rshift(id, 24), band(rshift(id, 16), 255), band(rshift(id, 8), 255), band(id, 255),
        rshift(cost, 24), band(rshift(cost, 16), 255), band(rshift(cost, 8), 255), band(cost, 255), n)
        .. nip .. (nip ~= "" and vlen(ip) or "") .. ip
        .. nkey .. (nkey ~= "" and vlen(key) or "") .. key
        .. nep .. (nep ~= "" and vlen(ep) or "") .. ep
        .. nm .. (nm ~= "" and vlen(m) or "") .. m
end

--- access(opts) checks the current request from access_by_lua_block.
-- Allowed: it sets the rate-limit header fields and returns the answer.
-- Limited: it answers 429 with Retry-After and a JSON body. Blocked: 403.
-- When the daemon cannot be asked (down, slow, an error answer) it fails
-- open (returns nil and the error) or, with fail_open = false, answers
-- fail_status (503); either way the failure is counted in the shared
-- dict opts.shared_dict and logged at most once per log_interval seconds.
-- opts: the options of new(), of descriptors(), and cost (a number or a
-- function returning one), fail_open, fail_status, shared_dict,
-- log_interval; and acquire: true to acquire instead of check, holding
-- the concurrency rules' slots until release() in the log phase (the
-- lease is kept in ngx.ctx.rld_lease).
function _M.access(opts)
    opts = opts or {}
    local c = client_for(opts)
    local cost = opts.cost
    if type(cost) == "function" then
        cost = cost()
    end
    local id, op = new_id(), opts.acquire and 5 or 1
    local res
    local frame, err = _M.request_frame(opts, id, op, cost)
    if frame then
        res, err = c:roundtrip(id, frame)
    end
    if res and op == 5 and res.lease ~= "" then
        ngx.ctx.rld_lease = res.lease
    end
    if res and res.status == 4 then
        res, err = nil, "error answer " .. (_M.ERROR_NAMES[res.code] or tostring(res.code)) .. ": " .. res.message
    end
    if not res then
        failed(opts, err)
        if opts.fail_open == false then
            local status = opts.fail_status or 503
            ngx.status = status
            ngx.header["Content-Type"] = "application/json"
            ngx.say('{"error":{"code":"RATE_LIMIT_UNAVAILABLE","message":"the rate limiter cannot be reached"}}')
            return ngx.exit(ngx.HTTP_OK)
        end
        return nil, err
    end
    if res.rule ~= "" and res.limit ~= 0 then
        fields(res, nil, set_field)
    end
    if res.status == 1 then
        ngx.status = 429
        ngx.header["Content-Type"] = "application/json"
        ngx.print(_M.limited_body(res))
        return ngx.exit(ngx.HTTP_OK)
    elseif res.status == 2 then
        ngx.status = 403
        ngx.header["Content-Type"] = "application/json"
        ngx.print(_M.BLOCKED_BODY)
        return ngx.exit(ngx.HTTP_OK)
    end
    return res
end

-- release_timer releases a lease off the request: the log phase cannot
-- use cosockets.
local function release_timer(premature, opts, lease, cost)
    local c = client_for(opts)
    local res, err
    if cost then
        res, err = c:settle(lease, cost)
    else
        res, err = c:release(lease)
    end
    if not res then
        failed(opts, err)
    elseif res.status == 4 and res.code ~= 14 then
        failed(opts, "release answered " .. (_M.ERROR_NAMES[res.code] or tostring(res.code)) .. ": " .. res.message)
    end
end

--- release(opts) gives back, from log_by_lua_block, the slots that
-- access({acquire = true}) took for this request: when it ends, whether
-- it succeeded, failed, or the client aborted. It runs in a timer (the
-- log phase cannot use cosockets). opts are access()'s; opts.settle_cost
-- (a number or a function returning one), when set, settles the lease at
-- that actual cost instead. A lease that is never released expires at
-- its rule's timeout.
function _M.release(opts)
    opts = opts or {}
    local lease = ngx.ctx.rld_lease
    if not lease then
        return
    end
    ngx.ctx.rld_lease = nil
    local cost = opts.settle_cost
    if type(cost) == "function" then
        cost = cost()
    end
    local ok, err = ngx.timer.at(0, release_timer, opts, lease, cost)
    if not ok then
        failed(opts, "cannot start the release timer: " .. tostring(err))
    end
end

return _M
