-- RFC 6581 §9 Enhanced RDMA Connection Establishment Data for tshark 4.0, whose iwarp_mpa
-- dissector implements RFC 5044 only (it shows the S bit as "Res" and the enhanced data as
-- raw private data). A postdissector: for every MPA Request/Reply with S (0x10 of the flags
-- byte) it decodes the first 4 bytes of the private data.
-- Part of smc-rs tests/kernel-peer; use with: tshark -X lua_script:mpa_6581.lua
local p = Proto("mpa6581", "RFC 6581 Enhanced RDMA Connection Establishment Data")
local f_p2p = ProtoField.bool("mpa6581.p2p", "A: peer-to-peer", 16, nil, 0x8000)
local f_send = ProtoField.bool("mpa6581.send_rtr", "B: zero-length Send RTR", 16, nil, 0x4000)
local f_ird = ProtoField.uint16("mpa6581.ird", "IRD", base.DEC, nil, 0x3fff)
local f_write = ProtoField.bool("mpa6581.write_rtr", "C: zero-length RDMA Write RTR", 16, nil, 0x8000)
local f_read = ProtoField.bool("mpa6581.read_rtr", "D: zero-length RDMA Read RTR", 16, nil, 0x4000)
local f_ord = ProtoField.uint16("mpa6581.ord", "ORD", base.DEC, nil, 0x3fff)
p.fields = { f_p2p, f_send, f_ird, f_write, f_read, f_ord }

local res_f = Field.new("iwarp_mpa.res")
local pd_f = Field.new("iwarp_mpa.privatedata")

function p.dissector(tvb, pinfo, tree)
	local res = res_f()
	local pd = pd_f()
	if res == nil or pd == nil then return end
	-- tshark's "Res" covers the low 5 bits of the flags byte, S included (0x10)
	if bit.band(res.value, 0x10) == 0 or pd.range:len() < 4 then return end
	local r = pd.range
	local t = tree:add(p, r(0, 4))
	t:add(f_p2p, r(0, 2))
	t:add(f_send, r(0, 2))
	t:add(f_ird, r(0, 2))
	t:add(f_write, r(2, 2))
	t:add(f_read, r(2, 2))
	t:add(f_ord, r(2, 2))
end
register_postdissector(p)
