-- replay.lua replays clients/testdata/golden.tsv against rld.lua, inside
-- nginx (content_by_lua_file, with $corpus set to the corpus's path). It
-- prints "ok ..." when every line matches, else one "FAIL ..." line per
-- mismatch. For every decode line it also flips each byte of the frame
-- and requires the decoder to reject it or decode another answer.
local rld = require "rld"
local bit = require "bit"

local function unhex(h)
    if h == "-" then
        return ""
    end
    return (h:gsub("..", function(x) return string.char(tonumber(x, 16)) end))
end

local function tohex(s)
    return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function split(s, sep)
    local out, i = {}, 1
    while true do
        local j = s:find(sep, i, true)
        if not j then
            out[#out + 1] = s:sub(i)
            return out
        end
        out[#out + 1] = s:sub(i, j - 1)
        i = j + 1
    end
end

local function descs(field)
    if field == "-" then
        return {}
    end
    local list = {}
    for _, item in ipairs(split(field, ",")) do
        local nv = split(item, ":")
        list[#list + 1] = { unhex(nv[1]), unhex(nv[2]) }
    end
    return list
end

local FIELDS = { "id", "op", "flags", "status", "limit", "remaining", "reset", "retry", "window", "quota", "quota_window", "next", "rule", "code", "message", "lease" }

local function same(a, b)
    for _, k in ipairs(FIELDS) do
        if a[k] ~= b[k] then
            return false, k
        end
    end
    return true
end

local fails, cases, flips, kinds = {}, 0, 0, {}
local function fail(...)
    fails[#fails + 1] = table.concat({ "FAIL", ... }, " ")
end

local f = assert(io.open(ngx.var.corpus, "rb"))
for line in f:lines() do
    if line ~= "" and line:sub(1, 1) ~= "#" then
        local t = split(line, "\t")
        local kind, name = t[1], t[2]
        cases = cases + 1
        kinds[kind] = true
        if kind == "encode" then
            local frame, err = rld.encode(tonumber(t[3]), tonumber(t[4]), tonumber(t[5]), descs(t[6]))
            if not frame then
                fail(name, "encode error:", err)
            elseif tohex(frame) ~= t[7] then
                fail(name, "encoded", tohex(frame):sub(1, 120), "want", t[7]:sub(1, 120))
            end
        elseif kind == "encode_error" then
            local frame = rld.encode(tonumber(t[3]), tonumber(t[4]), tonumber(t[5]), descs(t[6]))
            if frame then
                fail(name, "encoded a frame; want an error:", t[7])
            end
        elseif kind == "encode_lease" then
            local frame, err = rld.encode(tonumber(t[3]), tonumber(t[4]), tonumber(t[5]), nil, unhex(t[6]))
            if not frame then
                fail(name, "encode error:", err)
            elseif tohex(frame) ~= t[7] then
                fail(name, "encoded", tohex(frame):sub(1, 120), "want", t[7]:sub(1, 120))
            end
        elseif kind == "encode_lease_error" then
            local frame = rld.encode(tonumber(t[3]), tonumber(t[4]), tonumber(t[5]), nil, unhex(t[6]))
            if frame then
                fail(name, "encoded a frame; want an error:", t[7])
            end
        elseif kind == "decode" or kind == "decode_acquire" then
            local frame = unhex(t[3])
            local want = {
                id = tonumber(t[4]), op = tonumber(t[5]), flags = tonumber(t[6]), status = tonumber(t[7]),
                limit = tonumber(t[8]), remaining = tonumber(t[9]), reset = tonumber(t[10]),
                retry = tonumber(t[11]), window = tonumber(t[12]), quota = tonumber(t[13]),
                quota_window = tonumber(t[14]), next = tonumber(t[15]), rule = unhex(t[16]),
                code = tonumber(t[17]), message = unhex(t[18]),
                lease = kind == "decode_acquire" and unhex(t[19]) or "",
            }
            local got, err = rld.decode(frame)
            if not got then
                fail(name, "decode error:", err)
            else
                local ok, field = same(got, want)
                if not ok then
                    fail(name, field, tostring(got[field]), "want", tostring(want[field]))
                end
                for i = 1, #frame do
                    for _, x in ipairs({ 0x01, 0xff }) do
                        local b = string.char(bit.bxor(frame:byte(i), x))
                        local flipped = frame:sub(1, i - 1) .. b .. frame:sub(i + 1)
                        local r = rld.decode(flipped)
                        flips = flips + 1
                        if r and same(r, want) then
                            fail(name, "byte", i - 1, "xor", x, "decodes to the same answer")
                        end
                    end
                end
            end
        elseif kind == "decode_error" then
            local got = rld.decode(unhex(t[3]))
            if got then
                fail(name, "decoded; want an error:", t[4])
            end
        else
            fail(name or "?", "unknown kind", kind)
        end
    end
end
f:close()
for _, k in ipairs({ "encode", "encode_error", "encode_lease", "encode_lease_error", "decode", "decode_acquire", "decode_error" }) do
    if not kinds[k] then
        fail("the corpus has no", k, "line")
    end
end
if #fails > 0 then
    ngx.say(table.concat(fails, "\n"))
else
    ngx.say("ok ", cases, " cases, ", flips, " flipped frames")
end
