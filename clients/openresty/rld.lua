-- rld.lua: the OpenResty / nginx (lua-nginx-module) client of rld, the
-- rate-limit daemon. One file, no dependency beyond what OpenResty and
-- Debian's libnginx-mod-http-lua ship (cosockets, ngx.*).
--
--   local rld = require "rld"
--   -- in access_by_lua_block, the one-call helper:
--   rld.access{ socket = "unix:/run/rld/rld.sock" }  -- sends the request's attributes
--   -- or by hand:
--   local c = rld.new{ timeout = 100 }
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
local MAX_FRAME, MAX_DESCS, MAX_NAME, MAX_VALUE, MAX_MESSAGE = 65536, 32, 64, 1024, 1024
-- An attribute (a name starting with ':') may carry a longer value.
local MAX_ATTR_VALUE = 16384
_M.MAX_FRAME, _M.MAX_VALUE, _M.MAX_ATTR_VALUE = MAX_FRAME, MAX_VALUE, MAX_ATTR_VALUE
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

-- SHA-256, for values longer than their limit. nginx links OpenSSL's
-- libcrypto (Debian's nginx dynamically, OpenResty its own build), so
-- its SHA256() is reached through the FFI; OpenResty's resty.sha256 is
-- the fallback. Neither Debian's libnginx-mod-http-lua nor ngx.* offers
-- a SHA-256 of its own.
local sha256_bin
do
    local ok, ffi = pcall(require, "ffi")
    if ok then
        pcall(ffi.cdef, "unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);")
        local found = pcall(function() return ffi.C.SHA256 end)
        if found then
            local md = ffi.new("unsigned char[32]")
            local C, ffi_string = ffi.C, ffi.string
            sha256_bin = function(s)
                C.SHA256(s, #s, md)
                return ffi_string(md, 32)
            end
        end
    end
    if not sha256_bin then
        local has, resty_sha256 = pcall(require, "resty.sha256")
        if has then
            sha256_bin = function(s)
                local h = resty_sha256:new()
                h:update(s)
                return h:final()
            end
        end
    end
end

local HEX = {}
for i = 0, 255 do
    HEX[i] = string.format("%02x", i)
end

--- sha256_hex(s) returns the SHA-256 of s in 64 lowercase hex digits, or
-- nil and an error when neither libcrypto's SHA256 nor resty.sha256 can
-- be found.
function _M.sha256_hex(s)
    if not sha256_bin then
        return nil, "no SHA-256: neither libcrypto's SHA256 (FFI) nor resty.sha256 is available"
    end
    local d = sha256_bin(s)
    local h = {}
    for i = 1, 32 do
        h[i] = HEX[byte(d, i)]
    end
    return concat(h)
end

--- digest(value, limit) returns value when it is at most limit bytes,
-- else "sha256:" and the 64 hex digits of its SHA-256 (docs/protocol.md:
-- the one rule for long values), or nil and an error without a SHA-256.
local function digest(v, limit)
    if #v <= limit then
        return v
    end
    local h, err = _M.sha256_hex(v)
    if not h then
        return nil, err
    end
    return "sha256:" .. h
end
_M.digest = digest

--- limit_of(name) returns the longest value that a descriptor or an
-- attribute named name is sent with before it is digested: :target
-- 16384 bytes, :h:* 4096, every other name 1024.
local function limit_of(name)
    if byte(name, 1) == 58 then -- ':'
        if name == ":target" then
            return 16384
        end
        if sub(name, 1, 3) == ":h:" then
            return 4096
        end
    end
    return MAX_VALUE
end
_M.limit_of = limit_of

-- LuaJIT's string.buffer (LuaJIT 2.1 since 2021) builds a frame in one
-- buffer; without it, encode concatenates a table of parts.
local has_buffer, strbuf = pcall(require, "string.buffer")
local ebuf = has_buffer and strbuf.new(512) or nil

--- encode(id, op, cost, descs, lease) returns the request frame (a
-- string), or nil and an error for a request the protocol cannot carry
-- (more than 32 descriptors, an empty or 65-byte name, a 1025-byte value
-- (16385 bytes for an attribute, whose name starts with ':'), a cost that
-- does not fit in 4 bytes, a frame over 65536 bytes, a lease
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
        if vl > MAX_VALUE and (vl > MAX_ATTR_VALUE or byte(name, 1) ~= 58) then
            return nil, "descriptor " .. name .. ": value of " .. vl .. " bytes (at most "
                .. (byte(name, 1) == 58 and MAX_ATTR_VALUE or MAX_VALUE) .. ")"
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
        return nil, "length field " .. length .. " above " .. (MAX_FRAME - 4)
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

--- digested(descs) returns descs (a list of {name, value} or a map) as
-- a list whose values longer than their limit (limit_of) are digested:
-- the list itself when no value is long. A long value never makes a
-- check fail.
function _M.digested(descs)
    local list = pairs_of(descs)
    local out
    for i = 1, #list do
        local d = list[i]
        local name, value = d[1], d[2]
        if type(value) ~= "string" then
            value = tostring(value or "")
        end
        if type(name) == "string" and #value > limit_of(name) then
            local v, err = digest(value, limit_of(name))
            if not v then
                return nil, err
            end
            if not out then
                out = {}
                for j = 1, #list do
                    out[j] = list[j]
                end
            end
            out[i] = { name, v }
        end
    end
    return out or list
end

local Client = {}
Client.__index = Client

--- new(opts) returns a client. opts (all optional):
--   socket        "unix:/run/rld/rld.sock"
--   timeout       100 (ms): connect, send and receive, each; above the
--                 daemon's store.timeout (25 ms), so that a slow Redis is
--                 met by rld's own fallback, not by failing open
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
        timeout = opts.timeout or 100,
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
    if descs ~= nil then
        local err
        descs, err = _M.digested(descs)
        if not descs then
            return nil, err
        end
    end
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

-- The request's attributes (docs/protocol.md, "Request attributes"): what
-- nginx saw of the request, raw. rld derives the descriptors (ip, method,
-- host, endpoint, api_key, ...) from them by its [request] rules.

--- HEADERS are the request header fields sent by default, as :h:NAME
-- attributes when the request carries them.
_M.HEADERS = { "x-api-key", "authorization", "x-forwarded-for", "x-real-ip", "forwarded", "cookie" }
local MAX_HEADERS = 8

-- The attributes' names as a frame carries them: the name's length byte
-- and the name.
local NAME_PEER, NAME_METHOD, NAME_HOST, NAME_TARGET = "\5:peer", "\7:method", "\5:host", "\7:target"
local header_wire = {} -- header name as configured -> {lower-case name, wire name}

-- header_name returns the lower-case name of a configured header and its
-- attribute's name as a frame carries it, computed once per name.
local function header_name(h)
    local w = header_wire[h]
    if not w then
        local lower = string.lower(h)
        local attr = ":h:" .. lower
        if #attr > MAX_NAME then
            return nil, "header name " .. h .. " is longer than " .. (MAX_NAME - 3) .. " bytes"
        end
        w = { lower, char(#attr) .. attr }
        header_wire[h] = w
    end
    return w[1], w[2]
end

-- The values of one request's header attributes, reused by every request
-- of the worker (a request's check runs without yielding until its frame
-- is built).
local hnames, hvals = {}, {}

-- vlen returns a value's length as a frame carries it (u16).
-- VLEN holds the lengths below 256, the common case, made once.
local VLEN = {}
for n = 0, 255 do
    VLEN[n] = char(0, n)
end
local function vlen(v)
    local n = #v
    return VLEN[n] or char(rshift(n, 8), band(n, 255))
end

-- header_value returns the value of header name (lower case) in the
-- headers table of ngx.req.get_headers: several occurrences joined with
-- ", " in the order received, or nil when absent.
local function header_value(hs, name)
    local v = rawget(hs, name)
    if type(v) == "table" then
        return concat(v, ", ")
    end
    return v
end

local get_headers = ngx.req.get_headers

-- request_attrs reads the current request's attributes (digesting long
-- values) into its results and hnames/hvals; nh is the number of header
-- attributes, size their and the four others' bytes in the frame.
local function request_attrs(opts)
    local var = ngx.var
    local peer, method, host, target = var.remote_addr or "", ngx.req.get_method(), var.http_host, var.request_uri or ""
    if #peer > 1024 or #method > 1024 or #target > 16384 or (host and #host > 1024) then
        local err
        peer, err = digest(peer, 1024)
        method = digest(method, 1024)
        target = digest(target, 16384)
        host = host and digest(host, 1024)
        if not (peer and method and target) then
            return nil, err or "no SHA-256"
        end
    end
    local size = 3 * 3 + 5 + 7 + 7 + #peer + #method + #target
    if host then
        size = size + 3 + 5 + #host
    end
    local headers = opts.headers or _M.HEADERS
    local n = #headers
    if n > MAX_HEADERS then
        return nil, "headers: " .. n .. " names, at most " .. MAX_HEADERS
    end
    local nh = 0
    if n > 0 then
        -- 0: every header, however many the request has (the default
        -- stops at 100, which would let a request hide one behind 100
        -- others).
        local hs = get_headers(0)
        for i = 1, n do
            local name, wire = header_name(headers[i])
            if not name then
                return nil, wire
            end
            local v = header_value(hs, name)
            if v then
                if #v > 4096 then
                    local err
                    v, err = digest(v, 4096)
                    if not v then
                        return nil, err
                    end
                end
                nh = nh + 1
                hnames[nh], hvals[nh] = wire, v
                size = size + #wire + 2 + #v
            end
        end
    end
    return peer, method, host, target, nh, size
end

--- attributes(opts) returns what request_frame(opts, ...) sends for the
-- current request, as a list of {name, value}: the attributes :peer
-- (ngx.var.remote_addr), :method, :host (the Host header, when sent),
-- :target (ngx.var.request_uri, the raw target), :h:NAME for each header
-- of opts.headers (default HEADERS, at most 8 names) that the request
-- carries, then the descriptors of opts.descriptors (a list of {name,
-- value} or a map) and of opts.descriptors_fn() (per request). Values
-- longer than their limit are digested (limit_of). It returns nil and an
-- error for a configuration rld cannot take (more than 8 headers).
function _M.attributes(opts)
    local peer, method, host, target, nh = request_attrs(opts)
    if not peer then
        return nil, method
    end
    local d = { { ":peer", peer }, { ":method", method } }
    if host then
        d[#d + 1] = { ":host", host }
    end
    d[#d + 1] = { ":target", target }
    for i = 1, nh do
        d[#d + 1] = { sub(hnames[i], 2), hvals[i] }
    end
    for _, list in ipairs({ opts.descriptors or EMPTY, opts.descriptors_fn and opts.descriptors_fn() or EMPTY }) do
        local dl, err = _M.digested(list)
        if not dl then
            return nil, err
        end
        for i = 1, #dl do
            d[#d + 1] = dl[i]
        end
    end
    return d
end

--- request_frame(opts, id, op, cost) returns the frame that access(opts)
-- sends for the current request: the same bytes as encode(id, op, cost,
-- attributes(opts)), or nil and an error. Unless opts adds descriptors
-- of its own it is built without a table of descriptors: the values go
-- straight into one concatenation.
function _M.request_frame(opts, id, op, cost)
    if opts.descriptors or opts.descriptors_fn then
        local d, err = _M.attributes(opts)
        if not d then
            return nil, err
        end
        return _M.encode(id, op, cost, d)
    end
    cost = cost or 1
    if type(cost) ~= "number" or cost < 0 or cost > MAX_U32 or cost ~= floor(cost) then
        return nil, "cost " .. tostring(cost) .. " is not a whole number from 0 to 4294967295"
    end
    local peer, method, host, target, nh, size = request_attrs(opts)
    if not peer then
        return nil, method
    end
    -- At most 4 + 8 attributes of at most 16384 + 3 × 1024 + 8 × 4096
    -- bytes: the frame always fits.
    size = size + 17
    local l = size - 4
    -- Plain concatenation, which LuaJIT compiles (a string.buffer's
    -- tostring it does not).
    local hs = ""
    for i = 1, nh do
        local v = hvals[i]
        hs = hs .. hnames[i] .. vlen(v) .. v
        hvals[i] = nil
    end
    return char(rshift(l, 24), band(rshift(l, 16), 255), band(rshift(l, 8), 255), band(l, 255), 1, op, 0, 0,
        rshift(id, 24), band(rshift(id, 16), 255), band(rshift(id, 8), 255), band(id, 255),
        rshift(cost, 24), band(rshift(cost, 16), 255), band(rshift(cost, 8), 255), band(cost, 255),
        nh + (host and 4 or 3))
        .. NAME_PEER .. vlen(peer) .. peer .. NAME_METHOD .. vlen(method) .. method
        .. (host and NAME_HOST .. vlen(host) .. host or "")
        .. NAME_TARGET .. vlen(target) .. target .. hs
end
-- The error codes of an answer that mean rld cannot decide now:
-- internal, overloaded, unavailable. The access helper fails open (or
-- fail_status) on them as when rld is down; any other error answer is
-- refused with 500.
local UNAVAILABLE = { [7] = true, [8] = true, [11] = true }

-- refuse answers 500: rld was asked and could not take the check (an
-- error answer other than UNAVAILABLE's, or options it cannot carry).
local function refuse(opts, err)
    failed(opts, err)
    ngx.status = 500
    ngx.header["Content-Type"] = "application/json"
    ngx.say('{"error":{"code":"RATE_LIMIT_ERROR","message":"the rate limiter refused the check"}}')
    return ngx.exit(ngx.HTTP_OK)
end

--- access(opts) checks the current request from access_by_lua_block:
-- it sends the request's attributes (see attributes()) and applies the
-- answer. Allowed: it sets the rate-limit header fields and returns the
-- answer. Limited: it answers 429 with Retry-After and a JSON body.
-- Blocked: 403. When the daemon cannot be asked (down, slow, a broken
-- connection, or an error answer internal, overloaded or unavailable) it
-- fails open (returns nil and the error) or, with fail_open = false,
-- answers fail_status (503). Any other error answer, and options rld
-- cannot take, answer 500: nothing a request contains makes a check fail
-- open. Every failure is counted in the shared dict opts.shared_dict and
-- logged at most once per log_interval seconds.
-- opts: the options of new(), of attributes() (headers, descriptors,
-- descriptors_fn), and cost (a number or a function returning one),
-- fail_open, fail_status, shared_dict, log_interval; and acquire: true to
-- acquire instead of check, holding the concurrency rules' slots until
-- release() in the log phase (the lease is kept in ngx.ctx.rld_lease).
function _M.access(opts)
    opts = opts or {}
    local c = client_for(opts)
    local cost = opts.cost
    if type(cost) == "function" then
        cost = cost()
    end
    local id, op = new_id(), opts.acquire and 5 or 1
    local frame, err = _M.request_frame(opts, id, op, cost)
    if not frame then
        return refuse(opts, err)
    end
    local res
    res, err = c:roundtrip(id, frame)
    if res and op == 5 and res.lease ~= "" then
        ngx.ctx.rld_lease = res.lease
    end
    if res and res.status == 4 then
        err = "error answer " .. (_M.ERROR_NAMES[res.code] or tostring(res.code)) .. ": " .. res.message
        if not UNAVAILABLE[res.code] then
            return refuse(opts, err)
        end
        res = nil
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
