//! The part of rdma-core's libibverbs ABI (`<infiniband/verbs.h>`, `libibverbs.so.1`)
//! that this provider uses, declared by hand and loaded at run time.
//!
//! Why by hand and not bindgen or an rdma-core bindings crate: the `smc` binary must start
//! on hosts without rdma-core, so nothing may link libibverbs at build time, and a build
//! must not need libclang or rdma-core's headers. libibverbs keeps its ABI stable (symbol
//! versions `IBVERBS_1.0`/`1.1`; structures are only ever extended at the end), so the
//! declarations below hold for every rdma-core release since the ops table got its current
//! shape (v17). `tests/layout.rs` compiles a C program against the installed verbs.h and
//! compares every size and offset used here with these declarations.
//!
//! The fast-path verbs `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are `static inline` in verbs.h: they call through the provider's
//! ops table in `struct ibv_context` (`ctx->ops.post_send(...)`), which is why dlsym
//! cannot find them and why [`IbvContext`] declares the table.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

/// `struct ibv_device`: the names libibverbs found in sysfs. Only `dev_name` (the
/// uverbs character device, `uverbs0`) is read, to recognise the device's removal
/// (see `device::uevent`); the rest is passed back to libibverbs.
#[repr(C)]
pub struct ibv_device {
    _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    /// `IBV_SYSFS_NAME_MAX` = 64
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    /// `IBV_SYSFS_PATH_MAX` = 256
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers; only the four fast-path ones are
/// named (indexes 11, 12, 25, 26 of verbs.h's declaration).
#[repr(C)]
pub struct ibv_context_ops {
    _compat0: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    _compat1: [*mut c_void; 12],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    _compat2: [*mut c_void; 5],
}

/// `struct ibv_context` (the prefix up to `num_comp_vectors`; libibverbs allocates it).
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}
/// Alias used in docs.
pub type IbvContext = ibv_context;

/// `struct ibv_pd` (prefix).
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (prefix up to `cqe`).
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
}

/// `struct ibv_qp` (prefix up to `qp_type`).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`. The exported `ibv_query_port` (IBVERBS_1.1) fills the
/// `_compat_ibv_port_attr` prefix of it (everything before `port_cap_flags2`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network byte order) / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`, as its largest member (`atomic`); `rdma`
/// overlays `remote_addr` at 0 and `rkey` at 8.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_wr {
    pub remote_addr: u64,
    /// `rdma.rkey` (bits 0..32) or `atomic.compare_add`.
    pub word1: u64,
    /// `atomic.swap`.
    pub swap: u64,
    /// `atomic.rkey`.
    pub atomic_rkey: u32,
    _pad: u32,
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data`, network byte order.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type` union (XRC only).
    pub qp_type: u32,
    pub _pad: u32,
    /// The `bind_mw` / `tso` union (unused by RC SEND/WRITE/READ/atomics).
    pub _bind_mw: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: ibv_send_wr_wr::default(),
            qp_type: 0,
            _pad: 0,
            _bind_mw: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> Self {
        ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        }
    }
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `union ibv_gid`: 16 bytes, 8-byte aligned (its `global` member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid(pub [u8; 16]);

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// `element` union: `cq`, `qp`, `srq`, `wq` pointer or `port_num` (an int in the
    /// first 4 bytes).
    pub element: *mut c_void,
    pub event_type: c_uint,
}

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_SQD: c_uint = 4;
pub const IBV_QPS_SQE: c_uint = 5;
pub const IBV_QPS_ERR: c_uint = 6;
// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_COMP_SWAP: c_uint = 3;
pub const IBV_WC_FETCH_ADD: c_uint = 4;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;
// enum ibv_wc_flags
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
// enum ibv_wc_status
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_uint = 2;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_BAD_RESP_ERR: c_uint = 7;
pub const IBV_WC_LOC_ACCESS_ERR: c_uint = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_REM_OP_ERR: c_uint = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;
// enum ibv_event_type
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_uint = 9;
pub const IBV_EVENT_PORT_ERR: c_uint = 10;
pub const IBV_EVENT_GID_CHANGE: c_uint = 18;
// enum ibv_port_state
pub const IBV_PORT_ACTIVE: c_uint = 4;
// link_layer
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// The exported libibverbs functions this provider calls, resolved once with dlsym.
pub struct Api {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `ibv_reg_mr_iova2` (libibverbs ≥ 1.8, rdma-core 22): registration with an I/O
    /// virtual address of our choosing. Absent in older libraries.
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr>,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    pub event_type_str: unsafe extern "C" fn(c_uint) -> *const c_char,
    /// Keeps the library mapped as long as the function pointers above are used.
    _lib: Library,
}

/// Why libibverbs could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// dlopen failed (rdma-core is not installed, most likely).
    #[error("cannot load {lib}: {why}")]
    Open {
        /// The library name or path tried.
        lib: String,
        /// dlerror's text.
        why: String,
    },
    /// The library lacks a function this provider needs (too old or not libibverbs).
    #[error("{lib} has no symbol {symbol}: {why}")]
    Symbol {
        /// The library.
        lib: String,
        /// The missing symbol.
        symbol: &'static str,
        /// dlerror's text.
        why: String,
    },
}

/// libloading's error with its cause (dlerror's text).
fn why(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

impl Api {
    /// dlopens `lib` (normally `libibverbs.so.1`) and resolves every function.
    pub fn load(lib: &str) -> Result<Api, LoadError> {
        // SAFETY: loading libibverbs runs its constructors, which only initialise
        // library-internal state; no Rust invariants depend on them.
        let l = unsafe { Library::new(lib) }.map_err(|e| LoadError::Open {
            lib: lib.to_string(),
            why: why(&e),
        })?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is a C function whose prototype in verbs.h is the
                // type of the field this expression initialises (checked by
                // tests/layout.rs against the installed header).
                let s = unsafe { l.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                    LoadError::Symbol {
                        lib: lib.to_string(),
                        symbol: $name,
                        why: why(&e),
                    }
                })?;
                *s
            }};
        }
        Ok(Api {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            // SAFETY: as `sym!`; the prototype is verbs.h's `ibv_reg_mr_iova2`.
            reg_mr_iova2: unsafe { l.get(b"ibv_reg_mr_iova2\0") }.ok().map(|s| *s),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            query_qp: sym!("ibv_query_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            get_async_event: sym!("ibv_get_async_event"),
            ack_async_event: sym!("ibv_ack_async_event"),
            event_type_str: sym!("ibv_event_type_str"),
            _lib: l,
        })
    }
}

/// Sizes and offsets the layout test compares with verbs.h: (name, value).
pub fn layout_facts() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.req_notify_cq)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
        ),
        (
            "offsetof(struct ibv_context, ops.post_recv)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
        ),
        (
            "offsetof(struct ibv_context, async_fd)",
            offset_of!(ibv_context, async_fd),
        ),
        (
            "offsetof(struct ibv_device, dev_name)",
            offset_of!(ibv_device, dev_name),
        ),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(ibv_mr, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(ibv_mr, rkey)),
        (
            "offsetof(struct ibv_comp_channel, fd)",
            offset_of!(ibv_comp_channel, fd),
        ),
        (
            "offsetof(struct ibv_cq, cq_context)",
            offset_of!(ibv_cq, cq_context),
        ),
        (
            "offsetof(struct ibv_qp, qp_num)",
            offset_of!(ibv_qp, qp_num),
        ),
        ("offsetof(struct ibv_qp, state)", offset_of!(ibv_qp, state)),
        (
            "sizeof(struct ibv_device_attr)",
            size_of::<ibv_device_attr>(),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
            offset_of!(ibv_device_attr, max_qp_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, phys_port_cnt)",
            offset_of!(ibv_device_attr, phys_port_cnt),
        ),
        ("sizeof(struct ibv_port_attr)", size_of::<ibv_port_attr>()),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset_of!(ibv_port_attr, link_layer),
        ),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            offset_of!(ibv_port_attr, active_mtu),
        ),
        ("sizeof(struct ibv_wc)", size_of::<ibv_wc>()),
        (
            "offsetof(struct ibv_wc, byte_len)",
            offset_of!(ibv_wc, byte_len),
        ),
        (
            "offsetof(struct ibv_wc, imm_data)",
            offset_of!(ibv_wc, imm_data),
        ),
        (
            "offsetof(struct ibv_wc, src_qp)",
            offset_of!(ibv_wc, src_qp),
        ),
        (
            "offsetof(struct ibv_wc, wc_flags)",
            offset_of!(ibv_wc, wc_flags),
        ),
        ("sizeof(struct ibv_sge)", size_of::<ibv_sge>()),
        ("sizeof(struct ibv_send_wr)", size_of::<ibv_send_wr>()),
        (
            "offsetof(struct ibv_send_wr, imm_data)",
            offset_of!(ibv_send_wr, imm_data),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, remote_addr),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, word1),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.compare_add)",
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, word1),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.swap)",
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, swap),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.atomic.rkey)",
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, atomic_rkey),
        ),
        ("sizeof(struct ibv_recv_wr)", size_of::<ibv_recv_wr>()),
        (
            "sizeof(struct ibv_qp_init_attr)",
            size_of::<ibv_qp_init_attr>(),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(ibv_qp_init_attr, qp_type),
        ),
        ("sizeof(struct ibv_qp_attr)", size_of::<ibv_qp_attr>()),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.grh.sgid_index)",
            offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_global_route, sgid_index),
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.is_global)",
            offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_ah_attr, is_global),
        ),
        (
            "offsetof(struct ibv_qp_attr, pkey_index)",
            offset_of!(ibv_qp_attr, pkey_index),
        ),
        (
            "offsetof(struct ibv_qp_attr, min_rnr_timer)",
            offset_of!(ibv_qp_attr, min_rnr_timer),
        ),
        (
            "offsetof(struct ibv_qp_attr, rnr_retry)",
            offset_of!(ibv_qp_attr, rnr_retry),
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<ibv_ah_attr>()),
        (
            "offsetof(struct ibv_qp_attr, rate_limit)",
            offset_of!(ibv_qp_attr, rate_limit),
        ),
        (
            "sizeof(struct ibv_async_event)",
            size_of::<ibv_async_event>(),
        ),
        (
            "offsetof(struct ibv_async_event, event_type)",
            offset_of!(ibv_async_event, event_type),
        ),
    ]
}
