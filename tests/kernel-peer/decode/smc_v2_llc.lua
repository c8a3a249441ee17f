-- smc_v2_llc.lua: tshark/Wireshark dissector for SMC-Rv2 LLC messages
-- (part of smc-rs tests/kernel-peer).
--
-- Wireshark 4.0's "smc" dissector knows the SMC-R v1 LLC messages only (first
-- byte 0x01..0x09, second byte 44). SMC-Rv2 LLC messages, as sent by Linux
-- over RoCEv2, carry the version in the high nibble of the type byte
-- (0x21..0x29) and a 16-bit length in bytes 1-2. Linux fills that length in
-- host byte order, i.e. little-endian on x86. Without this file tshark shows
-- them as data or, through the RPC-over-RDMA heuristic, as malformed RPCoRDMA.
--
-- Use:  tshark -X lua_script:smc_v2_llc.lua \
--              --disable-heuristic rpcrdma_infiniband -r capture.pcap
-- Filter fields start with "smcv2llc." (e.g. smcv2llc.type == 0x27).
--
-- A message whose length only makes sense read big-endian is decoded too, and
-- flagged with an expert note: a peer that sends it that way is not
-- byte-compatible with x86 Linux (the kernel itself only checks length >= 44).

local proto = Proto("smcv2llc", "SMC-Rv2 LLC")

local TYPE_NAMES = {
  [0x21] = "CONFIRM LINK",
  [0x22] = "ADD LINK",
  [0x23] = "ADD LINK CONT",
  [0x24] = "DELETE LINK",
  [0x25] = "REQUEST ADD LINK",
  [0x26] = "CONFIRM RKEY",
  [0x27] = "TEST LINK",
  [0x28] = "CONFIRM RKEY CONT",
  [0x29] = "DELETE RKEY",
}

-- DELETE LINK reason codes (RFC 7609 appendix A.8 plus the Linux additions)
local DEL_REASONS = {
  [0x00010000] = "LOST_PATH",
  [0x00020000] = "OP_INIT_TERM",
  [0x00030000] = "PROG_INIT_TERM",
  [0x00040000] = "PROT_VIOL",
  [0x00050000] = "NO_ASYM_NEEDED",
  [0x00100000] = "NOLNK",
  [0x00200000] = "NOLGR",
}

-- IB path MTU enumeration
local MTU_NAMES = { [1] = "256", [2] = "512", [3] = "1024", [4] = "2048", [5] = "4096" }

local F = proto.fields
F.type       = ProtoField.uint8("smcv2llc.type", "Message type", base.HEX, TYPE_NAMES)
F.version    = ProtoField.uint8("smcv2llc.version", "LLC version", base.DEC, nil, 0xF0)
F.length     = ProtoField.uint16("smcv2llc.length", "Length", base.DEC)
F.length_be  = ProtoField.bool("smcv2llc.length_big_endian", "Length sent big-endian")
F.flags      = ProtoField.uint8("smcv2llc.flags", "Flags", base.HEX)
F.response   = ProtoField.bool("smcv2llc.flags.response", "Response", 8, nil, 0x80)
F.reject     = ProtoField.bool("smcv2llc.flags.reject", "Reject", 8, nil, 0x40)
F.all        = ProtoField.bool("smcv2llc.flags.all", "Delete all links (link group)", 8, nil, 0x40)
F.orderly    = ProtoField.bool("smcv2llc.flags.orderly", "Orderly", 8, nil, 0x20)
F.negative   = ProtoField.bool("smcv2llc.flags.negative", "Negative response", 8, nil, 0x20)
F.retry      = ProtoField.bool("smcv2llc.flags.retry", "Retry", 8, nil, 0x10)
F.no_eyec    = ProtoField.uint8("smcv2llc.flags.no_rmbe_eyecatcher", "No RMBE eyecatcher", base.HEX, nil, 0x03)
F.mac        = ProtoField.ether("smcv2llc.sender_mac", "Sender MAC")
F.gid        = ProtoField.ipv6("smcv2llc.sender_gid", "Sender GID")
F.qpn        = ProtoField.uint24("smcv2llc.sender_qpn", "Sender QP number", base.HEX)
F.link_num   = ProtoField.uint8("smcv2llc.link_num", "Link number", base.DEC)
F.link_uid   = ProtoField.uint32("smcv2llc.link_uid", "Link user id", base.HEX)
F.max_links  = ProtoField.uint8("smcv2llc.max_links", "Max links", base.DEC)
F.max_conns  = ProtoField.uint8("smcv2llc.max_conns", "Max connections", base.DEC)
F.qp_mtu     = ProtoField.uint8("smcv2llc.qp_mtu", "QP MTU", base.DEC, MTU_NAMES, 0x0F)
F.psn        = ProtoField.uint24("smcv2llc.initial_psn", "Initial PSN", base.HEX)
F.direct     = ProtoField.bool("smcv2llc.ext.direct", "Direct (no gateway)", 8, nil, 0x80)
F.target_gid = ProtoField.ipv6("smcv2llc.ext.target_gid", "Client target GID")
F.ext_nrkeys = ProtoField.uint16("smcv2llc.ext.num_rkeys", "Number of rkeys", base.DEC)
F.rkey       = ProtoField.uint32("smcv2llc.rkey", "RMB rkey", base.HEX)
F.rkey_new   = ProtoField.uint32("smcv2llc.rkey_new", "RMB rkey on the new link", base.HEX)
F.vaddr      = ProtoField.uint64("smcv2llc.vaddr", "RMB virtual address", base.HEX)
F.reason     = ProtoField.uint32("smcv2llc.reason", "Reason", base.HEX, DEL_REASONS)
F.num_rkeys  = ProtoField.uint8("smcv2llc.num_rkeys", "Number of rkeys", base.DEC)
F.num_inval  = ProtoField.uint8("smcv2llc.num_invalid", "Number of invalid rkeys", base.DEC)
F.rt_count   = ProtoField.uint8("smcv2llc.rtoken_others", "Number of other rtokens", base.DEC)
F.rt_link    = ProtoField.uint8("smcv2llc.rtoken_link", "Link id", base.DEC)
F.user_data  = ProtoField.bytes("smcv2llc.user_data", "User data")
F.gid_count  = ProtoField.uint8("smcv2llc.gid_count", "GID count", base.DEC)
F.gid_entry  = ProtoField.ipv6("smcv2llc.gid_entry", "GID")

local E_BE = ProtoExpert.new("smcv2llc.length_be.expert", "length_v2 is big-endian; x86 Linux sends it little-endian",
                             expert.group.PROTOCOL, expert.severity.WARN)
local E_SHORT = ProtoExpert.new("smcv2llc.short.expert", "message shorter than its fields",
                                expert.group.MALFORMED, expert.severity.ERROR)
proto.experts = { E_BE, E_SHORT }

local function need(tvb, tree, off, len)
  if tvb:len() < off + len then
    tree:add_proto_expert_info(E_SHORT)
    return false
  end
  return true
end

local function confirm_link(tvb, t, ft)
  ft:add(F.no_eyec, tvb(3, 1))
  t:add(F.mac, tvb(4, 6))
  t:add(F.gid, tvb(10, 16))
  t:add(F.qpn, tvb(26, 3))
  t:add(F.link_num, tvb(29, 1))
  t:add(F.link_uid, tvb(30, 4))
  t:add(F.max_links, tvb(34, 1))
  t:add(F.max_conns, tvb(35, 1))
end

local function add_link(tvb, t, ft, len)
  ft:add(F.reject, tvb(3, 1))
  t:add(F.mac, tvb(4, 6))
  t:add(F.gid, tvb(12, 16))
  t:add(F.qpn, tvb(28, 3))
  t:add(F.link_num, tvb(31, 1))
  t:add(F.qp_mtu, tvb(32, 1))
  t:add(F.psn, tvb(33, 3))
  if len <= 44 then return end
  if not need(tvb, t, 44, 28) then return end
  local ext = t:add(proto, tvb(44, len - 44), "ADD LINK v2 extension")
  ext:add(F.direct, tvb(44, 1))
  ext:add(F.target_gid, tvb(46, 16))
  -- host byte order on the sender, like length_v2
  local n = tvb(70, 2):le_uint()
  ext:add_le(F.ext_nrkeys, tvb(70, 2))
  for i = 0, n - 1 do
    local off = 72 + 16 * i
    if off + 16 > tvb:len() then break end
    local rt = ext:add(proto, tvb(off, 16), "rtoken " .. (i + 1))
    rt:add(F.rkey, tvb(off, 4))
    rt:add(F.rkey_new, tvb(off + 4, 4))
    rt:add(F.vaddr, tvb(off + 8, 8))
  end
end

local function delete_link(tvb, t, ft)
  ft:add(F.all, tvb(3, 1))
  ft:add(F.orderly, tvb(3, 1))
  t:add(F.link_num, tvb(4, 1))
  t:add(F.reason, tvb(5, 4))
end

local function req_add_link(tvb, t)
  local n = tvb(24, 1):uint()
  t:add(F.gid_count, tvb(24, 1))
  for i = 0, n - 1 do
    local off = 28 + 16 * i
    if off + 16 > tvb:len() then break end
    t:add(F.gid_entry, tvb(off, 16))
  end
end

local function confirm_rkey(tvb, t, ft)
  ft:add(F.negative, tvb(3, 1))
  ft:add(F.retry, tvb(3, 1))
  for i = 0, 2 do
    local off = 4 + 13 * i
    local rt = t:add(proto, tvb(off, 13), i == 0 and "rtoken of this link" or ("rtoken " .. i))
    rt:add(i == 0 and F.rt_count or F.rt_link, tvb(off, 1))
    rt:add(F.rkey, tvb(off + 1, 4))
    rt:add(F.vaddr, tvb(off + 5, 8))
  end
end

local function delete_rkey(tvb, t, ft)
  ft:add(F.negative, tvb(3, 1))
  local n = tvb(4, 1):uint()
  t:add(F.num_rkeys, tvb(4, 1))
  t:add(F.num_inval, tvb(5, 1))
  for i = 0, n - 1 do
    local off = 8 + 4 * i
    if off + 4 > tvb:len() then break end
    t:add(F.rkey, tvb(off, 4))
  end
end

-- LLC messages travel only in SENDs (Linux posts them as IB SEND; a v2 message longer
-- than the path MTU starts in a SEND First). RDMA WRITE payload is application data and
-- may begin with any bytes: 100 MiB of random data holds thousands of 0x2N bytes.
local f_bth_opcode = Field.new("infiniband.bth.opcode")
local SEND_STARTS = { [0x00] = true, [0x04] = true, [0x05] = true }

local function heuristic(tvb, pinfo, tree)
  local avail = tvb:len()
  if avail < 44 then return false end
  local op = f_bth_opcode()
  if op and not SEND_STARTS[op.value] then return false end
  local ty = tvb(0, 1):uint()
  local name = TYPE_NAMES[ty]
  if not name then return false end
  local len = tvb(1, 2):le_uint()
  local big_endian = false
  if len < 44 or len > tvb:reported_length_remaining() then
    local be = tvb(1, 2):uint()
    if be < 44 or be > tvb:reported_length_remaining() then return false end
    len, big_endian = be, true
  end
  local flags = tvb(3, 1):uint()
  local resp = bit32.band(flags, 0x80) ~= 0
  local label = name .. (resp and " response" or " request")
  pinfo.cols.protocol = "SMC-Rv2 LLC"
  pinfo.cols.info:append(" [SMC-Rv2 LLC " .. label .. "]")
  local t = tree:add(proto, tvb(0, math.min(len, avail)), "SMC-Rv2 LLC " .. label)
  local tt = t:add(F.type, tvb(0, 1))
  tt:add(F.version, tvb(0, 1))
  if big_endian then
    t:add(F.length, tvb(1, 2))
    t:add(F.length_be, tvb(1, 2), true)
    t:add_proto_expert_info(E_BE)
  else
    t:add_le(F.length, tvb(1, 2))
  end
  local ft = t:add(F.flags, tvb(3, 1))
  ft:add(F.response, tvb(3, 1))
  if ty == 0x21 then
    confirm_link(tvb, t, ft)
  elseif ty == 0x22 then
    add_link(tvb, t, ft, len)
  elseif ty == 0x24 then
    delete_link(tvb, t, ft)
  elseif ty == 0x25 then
    req_add_link(tvb, t)
  elseif ty == 0x26 then
    confirm_rkey(tvb, t, ft)
  elseif ty == 0x27 then
    t:add(F.user_data, tvb(4, 16))
  elseif ty == 0x29 then
    delete_rkey(tvb, t, ft)
  end
  return true
end

proto:register_heuristic("infiniband.payload", heuristic)
